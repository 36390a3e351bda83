"""Loopback endpoints for tests and benchmarks: a real HTTP server on 127.0.0.1
(:mod:`.loopback`), one that follows a script (:mod:`.scripted`), one that replays an LM cache
(:mod:`.replay`) and one that misbehaves on a schedule (:mod:`.chaos`)."""
