"""The inference_service role's judgement of its server from facts (issue 30): loading is not a
fault, a stall is, a failed probe window and not one probe makes a running server unhealthy, a
missing rank or a hung completion is not serving."""
import importlib.util
import pathlib

import pytest
from ansible.errors import AnsibleFilterError

_ROOT = pathlib.Path(__file__).resolve().parents[4]
_spec = importlib.util.spec_from_file_location("gpuops_server_state", _ROOT / "plugins" / "plugin_utils" / "server_state.py")
ss = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ss)

UNIT = "sglang.service"
TIMEOUT = 1800


def seen(age=60.0, healthy=False, active="active", sub="running", gen=None, line=None):
    return {"unit": {"ActiveState": active, "SubState": sub, "MainPID": 100 if active == "active" else 0,
                     "LoadState": "loaded", "age_s": age},
            "probe": {"healthy": healthy, "statuses": [200] if healthy else [-1, -1, -1]},
            "generate": gen, "last_line": line}


def rank(pid, gpu, unit=UNIT, owner=None):
    return {"pid": pid, "unit": unit, "context_gpus": [gpu], "owner": owner}


RANKS = (rank(11, 0), rank(12, 1))
OK = {"ok": True, "hung": False, "status": 200, "ttft_s": 0.04}


def judge(observed, holders=RANKS, gpus=("0", "1"), changed=False, own=""):
    return ss.server_state(observed, list(holders), UNIT, list(gpus), TIMEOUT, unit_changed=changed, own=own)


def test_a_young_server_without_health_is_loading_and_waited_for_with_the_time_it_has_left():
    line = {"line": "Loading safetensors checkpoint shards:  40% Completed | 2/5", "age_s": 3}
    got = judge(seen(age=300, line=line))
    assert (got["state"], got["code"], got["restart"]) == ("loading", "loading", False)
    assert got["wait_s"] == 1500
    said = ss.server_say(got, TIMEOUT)["state"]
    assert said.startswith("loading: loading for 5 min 0 s") and "Loading safetensors" in said, said


def test_an_old_server_without_health_is_stalled_and_the_reason_names_its_age_and_last_progress():
    got = judge(seen(age=8 * 3600 + 3 * 60, line={"line": "Capturing cuda graph", "age_s": 7 * 3600 + 58 * 60}))
    assert (got["state"], got["code"], got["restart"]) == ("stalled", "stalled", True)
    assert ss.server_say(got)["reasons"] == [
        "no /health 200 in 8 h 3 min since its start; last log line 7 h 58 min ago: Capturing cuda graph"]


def test_a_stall_without_any_log_line_says_so():
    got = judge(seen(age=TIMEOUT + 1))
    assert ss.server_say(got)["reasons"] == ["no /health 200 in 30 min 1 s since its start; no log line since its start"]


def test_a_flag_change_restarts_a_loading_server_at_once():
    got = judge(seen(age=10), changed=True)
    assert got["state"] == "loading" and got["restart"] and got["reasons"] == ["unit_changed"]
    assert ss.server_say(got)["reasons"] == ["flags or unit changed"]


def test_a_serving_server_with_every_rank_and_a_completion_is_left_alone():
    got = judge(seen(age=9000, healthy=True, gen=OK))
    assert (got["state"], got["code"], got["restart"], got["ttft_s"]) == ("serving", "healthy", False, 0.04)


def test_a_missing_rank_is_not_serving_even_when_health_answers_and_the_reason_names_the_gpu():
    got = judge(seen(healthy=True, gen=OK), holders=[rank(11, 0)])
    assert (got["state"], got["code"], got["restart"], got["missing_gpus"]) == ("failed", "rank_missing", True, ["1"])
    assert "GPU 1" in ss.server_say(got)["reasons"][0]


def test_a_rank_of_another_unit_does_not_count_and_the_own_docker_container_does():
    other = [rank(11, 0), rank(12, 1, unit="other.service")]
    assert judge(seen(healthy=True, gen=OK), holders=other)["missing_gpus"] == ["1"]
    own = {"kind": "container", "id": "c" * 64, "confirmed": True}
    docker = [rank(11, 0, unit="docker-x.scope", owner=own), rank(12, 1, unit="docker-x.scope", owner=own)]
    assert judge(seen(healthy=True, gen=OK), holders=docker, own="c" * 64)["code"] == "healthy"
    assert judge(seen(healthy=True, gen=OK), holders=docker)["code"] == "rank_missing"
    unconfirmed = [dict(h, owner=dict(own, confirmed=False)) for h in docker]
    assert judge(seen(healthy=True, gen=OK), holders=unconfirmed, own="c" * 64)["code"] == "rank_missing"


def test_a_hung_completion_is_a_stall_and_a_failed_one_a_failure():
    got = judge(seen(healthy=True, gen={"ok": False, "hung": True, "status": -1}))
    assert (got["state"], got["code"], got["restart"]) == ("stalled", "generate_hung", True)
    got = judge(seen(healthy=True, gen={"ok": False, "hung": False, "status": 500}))
    assert (got["state"], got["code"], got["restart"]) == ("failed", "generate_failed", True)


@pytest.mark.parametrize("active,sub,state,code", [
    ("failed", "failed", "failed", "unit_failed"), ("inactive", "dead", "stopped", "unit_inactive"),
    ("activating", "auto-restart", "restarting", "unit_restarting"), ("", "", "stopped", "unit_missing")])
def test_a_unit_that_is_not_active_is_restarted(active, sub, state, code):
    got = judge(seen(active=active, sub=sub, age=None))
    assert (got["state"], got["code"], got["restart"]) == (state, code, True)


def test_an_unknown_age_gets_the_whole_budget_never_a_stall():
    got = judge(seen(age=None))
    assert got["state"] == "loading" and got["wait_s"] == TIMEOUT


def test_bad_input_names_what_is_wrong():
    with pytest.raises(AnsibleFilterError, match="health_timeout"):
        ss.server_state(seen(), [], UNIT, ["0"], 0)
    with pytest.raises(AnsibleFilterError, match="observation"):
        ss.server_state("x", [], UNIT, ["0"], 10)


def test_the_fact_after_a_restart_carries_the_time_to_serve_and_the_ttft():
    before = judge(seen(age=TIMEOUT + 5))
    waited = {"healthy": True, "ttft_s": 0.031, "time_to_serve_s": 12.5, "last_line": {"line": "ready", "age_s": 0.2}}
    fact = ss.server_after(before, waited, restarted=True, unit_age_s=12.6)
    assert fact == {"state": "serving", "code": "restarted", "age_s": 12.6, "ttft_s": 0.03, "time_to_serve_s": 12.5,
                    "last_progress": {"kind": "log", "line": "ready", "age_s": 0.2, "line_age_s": 0.2}}
    assert set(fact["state"] for fact in [fact]) <= set(ss.STATES)


def test_the_fact_after_a_waited_load_says_loaded_without_a_time_to_serve():
    before = judge(seen(age=100))
    fact = ss.server_after(before, {"healthy": True, "ttft_s": 0.02, "time_to_serve_s": 130}, unit_age_s=131)
    assert (fact["state"], fact["code"], fact["time_to_serve_s"], fact["ttft_s"]) == ("serving", "loaded", None, 0.02)
    assert ss.server_say(fact)["state"].startswith("serving: loaded and serving after 2 min 11 s")


def test_the_fact_after_a_failed_start():
    before = judge(seen(age=TIMEOUT + 5))
    assert ss.server_after(before, None, rolled_back=False)["state"] == "failed"
    back = ss.server_after(before, {"healthy": True, "ttft_s": 0.5}, rolled_back=True, unit_age_s=3)
    assert (back["state"], back["code"], back["ttft_s"]) == ("serving", "rolled_back", 0.5)


ENGINE = {"generate_path": "/generate"}


def test_inputs_that_fit():
    assert ss.server_inputs(1800, 5, 3, ENGINE, "sglang") == []


def test_a_health_timeout_shorter_than_the_probe_window_is_refused_naming_it():
    got = ss.server_inputs_checked(10, 5, 3, ENGINE, "sglang")
    assert [p["variable"] for p in got] == ["inference_service_health_timeout"]
    assert "15" in got[0]["msg"] and "inference_service_health_timeout=10" in got[0]["msg"]


def test_an_engine_without_a_generation_endpoint_is_refused_naming_the_table_entry():
    got = ss.server_inputs_checked(1800, 5, 3, {"health_path": "/health"}, "myengine")
    assert [p["variable"] for p in got] == ["inference_service__engines.myengine.generate_path"]
    assert "vars/main.yml" in got[0]["msg"]
