"""roles/inference_service/files/drain_stop.py's reading of the engine's requests in flight (pure part)
from its Prometheus text. The stop itself runs against real systemd in tests/integration/test_server_drain.py."""

import importlib.util
import os

FILES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "inference_service", "files")
_spec = importlib.util.spec_from_file_location("drain_stop", os.path.join(FILES, "drain_stop.py"))
ds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ds)

VLLM = ["vllm:num_requests_running", "vllm:num_requests_waiting"]
SGLANG = ["sglang:num_running_reqs", "sglang:num_queue_reqs"]

# As vLLM writes it (v1, two data-parallel engines): one sample per engine, running and waiting both count.
VLLM_TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:num_requests_running_total not ours, only a longer name
vllm:num_requests_running_total{engine="0"} 99.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
"""


def test_vllm_counts_running_and_waiting_over_every_engine():
    assert ds.in_flight(VLLM_TEXT, VLLM) == 6


def test_sglang_counts_its_own_gauges_and_ignores_the_other_engines():
    text = ('sglang:num_running_reqs{model_name="a \\"b\\" {c}"} 4.0\n'
            'sglang:num_queue_reqs{model_name="m"} 1\n' + VLLM_TEXT)
    assert ds.in_flight(text, SGLANG) == 5


def test_no_gauge_of_the_engine_is_an_unknown_count_not_zero():
    assert ds.in_flight("# nothing\nother_metric 1\n", VLLM) is None
    assert ds.in_flight('vllm:num_requests_running{engine="0"} NaN\n', VLLM) is None
    assert ds.in_flight("", VLLM) is None


def test_a_sample_with_a_timestamp_is_read():
    assert ds.in_flight("vllm:num_requests_running 2 1700000000000\n", VLLM) == 2


def test_no_metrics_endpoint_asked_is_said():
    assert ds.read_in_flight(None) == (None, "not serving")
