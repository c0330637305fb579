"""roles/inference_service/files/wait_healthy.py's reading of a container (pure part): what counts
as the engine crashed or restarted. The wait itself runs against real docker and podman in
tests/integration/test_container_health.py."""

import importlib.util
import os

FILES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "inference_service", "files")


def load():
    spec = importlib.util.spec_from_file_location("wait_healthy", os.path.join(FILES, "wait_healthy.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wh = load()


def state(status="running", restarts=0, exit_code="0"):
    return {"status": status, "restarts": restarts, "pid": 10, "exit_code": exit_code}


def test_nothing_is_concluded_before_the_runtime_knows_the_container():
    assert wh.container_gone("s", None, None) is None
    assert wh.container_gone("s", None, state("exited", exit_code="3")) is None


def test_a_running_container_that_did_not_restart_is_no_crash():
    assert wh.container_gone("s", state(restarts=2), state(restarts=2)) is None


def test_a_restart_by_the_runtime_ends_the_wait():
    assert "RestartCount 0 -> 1" in wh.container_gone("s", state(), state(restarts=1))
    # docker shows a container between two runs of its restart policy as restarting.
    assert wh.container_gone("s", state(), state("restarting")) is not None


def test_an_exit_or_a_removal_ends_the_wait():
    assert "exited with exit code 3" in wh.container_gone("s", state(), state("exited", exit_code="3"))
    assert "is gone" in wh.container_gone("s", state(), None)
