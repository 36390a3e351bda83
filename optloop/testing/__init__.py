"""Loopback endpoints for tests and benchmarks: a real HTTP server on 127.0.0.1 (:mod:`.loopback`), one that
follows a script (:mod:`.scripted`) and one that replays an LM cache (:mod:`.replay`)."""
