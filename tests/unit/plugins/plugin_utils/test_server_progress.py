"""An inference server's ranks' GPU memory as a progress fact (issue 30 item 1): memory that grew
since the kept reading is progress even while the log is quiet; a stall (memory flat, log quiet,
past its budget) is still a stall, its reason naming its last progress."""
import importlib.util
import pathlib

_ROOT = pathlib.Path(__file__).resolve().parents[4]


def _load(name):
    spec = importlib.util.spec_from_file_location("gpuops_" + name, _ROOT / "plugins" / "plugin_utils" / (name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sp = _load("server_progress")
ss = _load("server_state")

UNIT = "sglang.service"
START_US = 5_000_000_000          # systemd's start of the main process, CLOCK_MONOTONIC in µs
T0 = 1_800_000_000.0              # the node's wall clock at the main process's start


def observed(age, pid=100, start_us=START_US, line=None):
    return {"unit": {"ActiveState": "active", "SubState": "running", "MainPID": pid, "LoadState": "loaded",
                     "ExecMainStartTimestampMonotonic": start_us, "age_s": age, "start_epoch": T0},
            "probe": {"healthy": False, "statuses": [-1]}, "generate": None, "last_line": line}


def holders(*mib_by_gpu, unit=UNIT):
    return [{"pid": 200 + i, "unit": unit, "context_gpus": [int(g)], "gpu_memory_mib": {g: mib}}
            for i, (g, mib) in enumerate(mib_by_gpu)]


def test_the_ranks_mib_are_the_units_processes_on_the_servers_gpus_only():
    got = sp.ranks_mib(holders(("0", 1000), ("1", 2000)) + holders(("0", 500), unit="other.service")
                       + holders(("2", 700)), ["0", "1"], UNIT)
    assert got == 3000
    # No context of the unit yet (its ranks still import): 0 MiB, so the first mapping is growth.
    assert sp.ranks_mib(holders(("0", 500), unit="other.service"), ["0"], UNIT) == 0
    first = sp.memory_progress(None, observed(3), 0)
    assert sp.memory_progress(first["keep"], observed(30), 8000)["fact"]["grew_age_s"] == 0.0


def test_memory_that_grew_since_the_kept_reading_is_dated_by_the_observation_that_saw_it():
    first = sp.memory_progress(None, observed(100), 1000)
    # A first reading of this start: nothing to compare, never seen growing.
    assert first["fact"] == {"mib": 1000, "previous_mib": None, "since_s": None, "grew_age_s": None}
    assert first["keep"] == {"main": [100, START_US], "mib": 1000, "seen_epoch": T0 + 100, "grew_epoch": None}
    second = sp.memory_progress(first["keep"], observed(160), 4000)
    assert second["fact"] == {"mib": 4000, "previous_mib": 1000, "since_s": 60.0, "grew_age_s": 0.0}
    # Flat since: still dated by the observation that saw it grow.
    third = sp.memory_progress(second["keep"], observed(460), 4000)
    assert third["fact"]["grew_age_s"] == 300.0 and third["keep"]["grew_epoch"] == T0 + 160


def test_a_reading_of_another_start_of_the_unit_says_nothing():
    kept = sp.memory_progress(None, observed(100), 1000)["keep"]
    for other in (observed(5, pid=101), observed(5, start_us=START_US + 1)):
        got = sp.memory_progress(kept, other, 4000)
        assert got["fact"]["previous_mib"] is None and got["fact"]["grew_age_s"] is None
        assert got["keep"]["main"] == [other["unit"]["MainPID"], other["unit"]["ExecMainStartTimestampMonotonic"]]


def test_nothing_read_keeps_nothing():
    assert sp.memory_progress(None, observed(10), None) == {"keep": None, "fact": None}
    gone = observed(10)
    gone["unit"].update(MainPID=0, age_s=None, start_epoch=None)
    assert sp.memory_progress(None, gone, 1000) == {"keep": None, "fact": None}


def test_a_loading_server_with_a_quiet_log_and_growing_memory_names_the_memory_as_its_progress():
    line = {"line": "Loading safetensors checkpoint shards:  10% Completed | 1/10", "age_s": 240.0}
    memory = {"mib": 40960, "previous_mib": 20480, "since_s": 60.0, "grew_age_s": 0.0}
    got = ss.server_state(observed(300, line=line), [], UNIT, ["0"], 1800, memory=memory)
    assert (got["state"], got["code"], got["restart"]) == ("loading", "loading", False)
    assert got["last_progress"] == {"kind": "gpu_memory", "age_s": 0.0, "gpu_memory_mib": 40960,
                                    "line": line["line"], "line_age_s": 240.0}
    said = ss.server_say(got, 1800)["state"]
    assert "its ranks' GPU memory last grew 0 s ago, to 40960 MiB; last log line 4 min 0 s ago: Loading" in said, said


def test_a_stall_with_flat_memory_and_a_quiet_log_is_still_stalled_naming_its_last_progress():
    line = {"line": "Capture cuda graph begin", "age_s": 7 * 3600.0}
    # Memory last seen growing 7 h 50 min ago (an earlier run's observation), flat since.
    memory = {"mib": 76000, "previous_mib": 76000, "since_s": 300.0, "grew_age_s": 7 * 3600.0 + 50 * 60}
    got = ss.server_state(observed(8 * 3600.0, line=line), [], UNIT, ["0"], 1800, memory=memory)
    assert (got["state"], got["code"], got["restart"]) == ("stalled", "stalled", True)
    assert got["last_progress"]["kind"] == "log" and got["last_progress"]["gpu_memory_mib"] == 76000
    assert ss.server_say(got)["reasons"] == [
        "no /health 200 in 8 h 0 min since its start; last log line 7 h 0 min ago: Capture cuda graph begin"]
    # The memory grew after the last log line: the reason names it, and the line.
    memory["grew_age_s"] = 6 * 3600.0
    got = ss.server_state(observed(8 * 3600.0, line=line), [], UNIT, ["0"], 1800, memory=memory)
    assert got["code"] == "stalled" and ss.server_say(got)["reasons"] == [
        "no /health 200 in 8 h 0 min since its start; its ranks' GPU memory last grew 6 h 0 min ago, to 76000 MiB; "
        "last log line 7 h 0 min ago: Capture cuda graph begin"]


def test_the_filter_reads_the_holders_and_the_kept_reading():
    from ansible_collections.gpuops.reclaim.plugins.filter.server_progress import FilterModule
    f = FilterModule().filters()["server_progress"]
    kept = f(observed(100), None, holders(("0", 1000)), UNIT, ["0"])["keep"]
    assert f(observed(130), kept, holders(("0", 1500)), UNIT, ["0"])["fact"]["grew_age_s"] == 0.0
