"""The inference_service role's decisions about the engine: its --help, unknown flags, takeover."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError

_ROOT = pathlib.Path(__file__).resolve().parents[4]
_spec = importlib.util.spec_from_file_location("gpuops_engine", _ROOT / "plugins" / "plugin_utils" / "engine.py")
engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine)
FAKESERVE = _ROOT / "tests" / "fakeserve" / "fakeserve"

# The shape of real SGLang / vLLM argparse help (wrapped option columns, aliases,
# a flag named inside a description, BooleanOptionalAction).
HELP = """usage: launch_server.py [-h] --model-path MODEL_PATH [--tp-size TP_SIZE]

options:
  -h, --help            show this help message and exit
  --model-path MODEL_PATH, --model MODEL_PATH
                        The path of the model weights.
  --tp-size TP_SIZE, --tp TP_SIZE
                        The tensor parallelism size.
  --mem-fraction-static MEM_FRACTION_STATIC
                        The fraction of the memory used for static allocation. See also --not-a-flag-here.
  --enable-prefix-caching, --no-enable-prefix-caching
                        Prefix caching.
  -tp TENSOR_PARALLEL_SIZE, --tensor-parallel-size TENSOR_PARALLEL_SIZE
"""


def test_help_lists_every_long_option_and_alias_only_from_the_option_column():
    flags = engine.engine_help_flags(HELP)
    assert {"--help", "--model-path", "--model", "--tp-size", "--tp", "--mem-fraction-static",
            "--enable-prefix-caching", "--no-enable-prefix-caching", "--tensor-parallel-size"} <= set(flags)
    assert "--not-a-flag-here" not in flags


@pytest.mark.parametrize("name,args,expected", [
    ("fakeserve", ["--help"], {"--mem-fraction-static", "--tp-size", "--enable-hierarchical-cache", "--hicache-size"}),
    ("vllm", ["serve", "--help=all"], {"--tensor-parallel-size", "--gpu-memory-utilization", "--max-model-len",
                                       "--no-enable-prefix-caching"}),
])
def test_the_stand_in_answers_help_like_the_engines(tmp_path, name, args, expected):
    exe = tmp_path / name
    exe.symlink_to(FAKESERVE)
    out = subprocess.run([sys.executable, str(exe)] + args, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert expected <= set(engine.engine_help_flags(out.stdout))


def test_typo_is_named_with_the_closest_known_flag():
    known = engine.engine_help_flags(HELP)
    unknown = engine.flags_unknown({"mem_fracton_static": 0.9, "tp_size": 8, "model_path": "m"}, known)
    assert unknown == [{"key": "mem_fracton_static", "flag": "--mem-fracton-static", "closest": "--mem-fraction-static"}]


def test_unrelated_flag_has_no_closest_and_positional_is_not_judged():
    unknown = engine.flags_unknown({"zzz": 1, "model": "m", "--tp": 2}, ["--tp", "--model-path"], positional=["model"])
    assert unknown == [{"key": "zzz", "flag": "--zzz", "closest": None}]


def test_no_known_flags_judges_nothing_and_bad_input_is_named():
    assert engine.flags_unknown({"a": 1}, []) == []
    with pytest.raises(AnsibleFilterError, match="flags dict"):
        engine.flags_unknown(["a"], ["--a"])


def _proc(pid, cmdline, unit=None, **kw):
    return dict({"pid": pid, "start_time": 100 + pid, "name": cmdline.split()[0][:15], "cmdline": cmdline,
                 "unit": unit, "kind": "context", "protected": False, "gpus": [0], "context_gpus": [0]}, **kw)


PATTERNS = [r"sglang\.launch_server", r"^sglang::"]


def test_hand_started_engine_is_adopted_ours_kept_other_services_refused():
    owners = [_proc(10, "python3 -m sglang.launch_server --tp 8", "session-3.scope")]
    holders = [_proc(11, "sglang::scheduler_TP0"), _proc(12, "sglang::scheduler_TP1", gpus=[1], context_gpus=[1]),
               _proc(13, "sglang::scheduler_TP0", unit="sglang.service"),
               _proc(14, "jupyter-kernel", unit="jupyter.service"),
               _proc(15, "python3 train.py"),
               _proc(16, "dcgm-exporter", unit="dcgm.service", kind="handle"),
               _proc(17, "sglang::scheduler_TP5", gpus=[5], context_gpus=[5])]
    out = engine.server_takeover(owners, holders, "sglang.service", PATTERNS, gpus=["0", "1"])
    assert [(a["pid"], a["why"]) for a in out["adopt"]] == [
        (10, "listens on the port"), (11, "holds GPU 0"), (12, "holds GPU 1")]
    assert out["adopt"][0]["start_time"] == 110
    assert out["ours"] == [13]
    assert out["refuse"] == ["GPU 0 is held by PID 14 (jupyter-kernel) of jupyter.service"]
    assert [s["pid"] for s in out["strays"]] == [15]


def test_port_of_another_program_is_refused_and_adoption_off_refuses_the_engine_too():
    owners = [_proc(20, "nginx: master process", "nginx.service")]
    assert engine.server_takeover(owners, [], "sglang.service", PATTERNS)["refuse"] == [
        "the port is taken by PID 20 (nginx: master process) of nginx.service"]
    hand = [_proc(21, "python3 -m sglang.launch_server")]
    out = engine.server_takeover(hand, [], "sglang.service", [])
    assert out["adopt"] == [] and out["refuse"] == ["the port is taken by PID 21 (python3 -m sglang.launch_server)"]


def test_engine_under_another_service_is_not_adopted():
    owners = [_proc(30, "python3 -m sglang.launch_server", "other-sglang.service")]
    out = engine.server_takeover(owners, [], "sglang.service", PATTERNS)
    assert out["adopt"] == [] and "other-sglang.service" in out["refuse"][0]


def test_bad_pattern_is_named():
    with pytest.raises(AnsibleFilterError, match="bad adoption pattern"):
        engine.server_takeover([], [], "x.service", ["("])
