"""The crash-consistency matrix on the real ``python -m optloop.run``: SIGKILL at each checkpoint
boundary in turn, the same command resumes, compared with an uninterrupted run; and one of two
Optuna workers killed.

Every process talks to ``experiments.bench.crash.OracleEndpoint``, a loopback endpoint that needs
no model, so this runs in a few minutes on a busy machine (21 + 3 processes).
``python -m experiments.bench.crash --shared`` prints the same table.
"""

from __future__ import annotations

import pytest

from experiments.bench.crash import KILL_POINTS, markdown, matrix, shared


@pytest.mark.slow  # 24 optloop.run processes: about 4 minutes on 2 busy cores
def test_kill_at_every_checkpoint_boundary_and_resume_with_the_same_command(tmp_path, capsys):
    result = matrix(tmp_path, budget=3)
    result.shared = shared(tmp_path, budget=3)
    with capsys.disabled():
        print("\n" + markdown(result))
    assert [r.kill_point for r in result.rows] == list(KILL_POINTS)
    for r in result.rows:
        assert r.killed, (
            r.kill_point,
            r.problems,
        )  # the first process died by SIGKILL at its point
        assert r.resumed, (
            r.kill_point,
            r.problems,
        )  # the same command found the run and finished it
        assert r.identical, (
            r.kill_point,
            r.problems,
        )  # candidates, accuracies, registry versions and alias
        assert r.no_running and r.no_duplicate, (r.kill_point, r.problems)
        assert r.within_one_step and r.processes == 2, (r.kill_point, r.extra, result.bound)
        assert not r.problems, (r.kill_point, r.problems)
    assert result.clean["promoted"] and result.clean["registry"], (
        result.clean
    )  # registry promotion was at stake
    assert all(result.shared["checks"].values()), result.shared
