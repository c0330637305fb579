"""The run summary's per-host record (action reclaim_summary): pure function over host variables."""
from ansible_collections.gpuops.reclaim.plugins.action.reclaim_summary import host_record

ROW = {"index": 2, "memory_used_mib": 76000, "memory_total_mib": 81920, "free": False, "holders": [194909],
       "uuid": "GPU-x", "handles": []}
RESULT = {
    "changed": True, "elapsed_s": 0.21,
    "before": [ROW], "after": [dict(ROW, memory_used_mib=0, free=True, holders=[])],
    "holders": [{"pid": 194909, "name": "sglang::schedul", "cmdline": "sglang::scheduler_TP2", "unit": None,
                 "protected": False}],
    "actions": [{"at_s": 0.012, "step": "sigterm", "pid": 194909, "name": "sglang::schedul",
                 "result": "exited after SIGTERM in 0.12 s"}],
    "remaining": [],
}


def test_summary_record_of_a_freed_host_without_server():
    record = host_record({"gpus_free_result": RESULT})
    assert record["status"] == "ok" and record["changed"] is True and record["server"] is None
    assert record["gpus_before"] == [{"index": 2, "memory_used_mib": 76000, "memory_total_mib": 81920,
                                      "free": False, "holders": [194909]}]
    assert record["gpus_after"][0]["free"] is True
    assert record["actions"][0]["at_s"] == 0.012


def test_summary_record_of_a_failed_server_and_of_an_unreachable_host():
    failure = {"stage": "restart", "task": "Check the role's inputs", "msg": "bad input: port=70000"}
    record = host_record({"gpus_free_result": dict(RESULT, changed=False), "reclaim__failure": failure,
                          "inference_service_name": "sglang", "inference_service_flags": {"tp_size": 8},
                          "inference_service_info": {"max_total_num_tokens": 116000}})
    assert record["status"] == "failed" and record["failure"] == failure
    assert record["server"] == {"name": "sglang", "flags": {"tp_size": 8}, "max_total_num_tokens": 116000}
    assert host_record({})["status"] == "no result (unreachable)"
