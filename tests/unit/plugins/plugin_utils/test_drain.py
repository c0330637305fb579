"""The drain before a planned stop (issue 30 item 7): which drain and stop timeouts cannot work together,
the drain entry of the role's fact, and its sentence."""
import importlib.util
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[4]
_spec = importlib.util.spec_from_file_location("gpuops_drain", _ROOT / "plugins" / "plugin_utils" / "drain.py")
dr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dr)


@pytest.mark.parametrize("drain, stop", [(30, 60), (60, 60), (0, 60), ("30", "60"), (30.0, 60), (0, 0)])
def test_a_drain_the_stop_timeout_covers_is_accepted(drain, stop):
    assert dr.drain_inputs(drain, stop) == []


def test_a_drain_longer_than_the_stop_timeout_is_refused_naming_both():
    [problem] = dr.drain_inputs_checked(90, 60)
    assert problem["code"] == "drain_longer_than_stop" and problem["variable"] == "inference_service_drain_timeout"
    assert problem["msg"].startswith("inference_service_drain_timeout=90 is longer than inference_service_stop_timeout=60")


@pytest.mark.parametrize("drain", [-1, "soon", None, True, 2.5, float("nan"), float("inf"), [30]])
def test_a_drain_timeout_that_is_not_whole_seconds_of_0_or_more_is_refused(drain):
    [problem] = dr.drain_inputs_checked(drain, 60)
    assert problem["code"] == "drain_timeout_bad" and "inference_service_drain_timeout=" in problem["msg"]
    assert "whole number of seconds, 0 or more" in problem["msg"]


def test_a_bad_stop_timeout_is_named_rather_than_compared():
    [problem] = dr.drain_inputs(30, "a minute")
    assert (problem["code"], problem["variable"]) == ("stop_timeout_bad", "inference_service_stop_timeout")


def test_a_stop_that_found_the_unit_down_drained_nothing():
    assert dr.drain_record({"was_active": False, "seconds": 0.01}, 30) is None
    assert dr.drain_record(None, 30) is None
    assert dr.drain_say(None) == ""


def test_the_drain_entry_carries_the_count_the_time_and_systemds_kill():
    stopped = {"was_active": True, "in_flight": 2, "in_flight_error": None, "seconds": 6.4321, "result": "success"}
    record = dr.drain_record(stopped, 30)
    assert record == {"in_flight": 2, "in_flight_error": None, "seconds": 6.43, "timeout": 30, "killed": False}
    assert dr.drain_say(record) == "stopped with 2 requests in flight; drained and stopped in 6.43 s (drain timeout 30 s)"
    killed = dr.drain_record(dict(stopped, in_flight=1, seconds=60.2, result="timeout"), 30)
    assert killed["killed"] is True
    assert dr.drain_say(killed).endswith("1 request in flight; drained and stopped in 60.2 s (drain timeout 30 s), "
                                         "then SIGKILLed by systemd at the stop timeout")


def test_an_unread_count_says_why():
    record = dr.drain_record({"was_active": True, "in_flight": None, "seconds": 1,
                              "in_flight_error": "http://h:1/metrics answered 404", "result": "success"}, 30)
    assert dr.drain_say(record).startswith(
        "stopped with an unknown number of requests in flight (http://h:1/metrics answered 404)")
