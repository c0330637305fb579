"""Flag rendering: the inference_service unit's command line comes from here."""
import importlib.util
import pathlib
import shlex

import pytest
from ansible.errors import AnsibleFilterError

_PATH = pathlib.Path(__file__).resolve().parents[4] / "plugins" / "plugin_utils" / "flags.py"
_spec = importlib.util.spec_from_file_location("gpuops_flags", _PATH)
flags = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flags)
cli_flags, systemd_quote = flags.cli_flags, flags.systemd_quote


def test_seed_flags_render_as_sglang_spells_them():
    argv = cli_flags({"tp_size": 8, "mem_fraction_static": 0.93, "enable_hierarchical_cache": True,
                      "hicache_size": 300, "disable_cuda_graph": False, "model_path": "/models/kimi"})
    assert argv == ["--enable-hierarchical-cache", "--hicache-size", "300", "--mem-fraction-static", "0.93",
                    "--model-path", "/models/kimi", "--tp-size", "8"]


def test_false_and_null_are_omitted_true_is_bare():
    assert cli_flags({"a": False, "b": None, "c": True}) == ["--c"]


def test_list_repeats_the_flag():
    assert cli_flags({"api_key": ["x", "y"]}) == ["--api-key", "x", "--api-key", "y"]


def test_dict_value_is_compact_json():
    assert cli_flags({"compilation_config": {"level": 3}}) == ["--compilation-config", '{"level":3}']


def test_order_does_not_depend_on_dict_order():
    assert cli_flags({"b": 1, "a": 2}) == cli_flags({"a": 2, "b": 1})


def test_verbatim_key_and_grouped():
    assert cli_flags({"--Weird_Flag": 1, "x": True}, grouped=True) == [["--Weird_Flag", "1"], ["--x"]]


def test_empty_and_none_input():
    assert cli_flags({}) == [] and cli_flags(None) == []


@pytest.mark.parametrize("bad,needle", [
    ({"bad key": 1}, "'bad key'"),
    ({"-x": 1}, "'-x'"),
    ({"a": object()}, "'a'"),
    ({"a": [True]}, "'a'"),
    (["--tp-size", 8], "expected a dict"),
])
def test_bad_input_names_the_bad_value(bad, needle):
    with pytest.raises(AnsibleFilterError, match=needle.replace("(", r"\(")):
        cli_flags(bad)


def test_positional_flags_come_first_as_bare_words():
    argv = cli_flags({"tensor_parallel_size": 2, "model": "/models/llama", "enforce_eager": True},
                     positional=["model"])
    assert argv == ["/models/llama", "--enforce-eager", "--tensor-parallel-size", "2"]
    assert shlex.split(" ".join(argv))[0] == "/models/llama"


def test_positional_flag_absent_or_false_is_left_out():
    assert cli_flags({"tp": 1}, positional=["model"]) == ["--tp", "1"]
    assert cli_flags({"model": None}, positional=["model"]) == []


@pytest.mark.parametrize("bad", [True, ["a", "b"]])
def test_positional_flag_needs_one_value(bad):
    with pytest.raises(AnsibleFilterError, match="'model' is positional"):
        cli_flags({"model": bad}, positional=["model"])


def test_systemd_quote_plain_words_unchanged():
    assert systemd_quote(["--tp-size", "8", "/models/a.b", "0.93"]) == ["--tp-size", "8", "/models/a.b", "0.93"]


def test_systemd_quote_escapes_specifiers_and_quotes():
    assert systemd_quote("50%") == "\"50%%\""
    assert systemd_quote("$HOME") == '"$$HOME"'
    assert systemd_quote('say "hi"') == '"say \\"hi\\""'
    assert systemd_quote("") == '""'


def test_systemd_quote_round_trips_through_a_shell_like_parser():
    # systemd's quoting is a superset of what shlex understands for these words
    words = ["a b", 'x"y', "back\\slash", "{\"k\":1}"]
    quoted = " ".join(systemd_quote(words))
    assert shlex.split(quoted) == words


def test_flags_diff_confirms_matching_and_names_differences():
    info = {"mem_fraction_static": 0.85, "tp_size": 8, "enable_hierarchical_cache": False, "hicache_size": 0,
            "max_total_num_tokens": 116000}
    wanted = {"mem_fraction_static": 0.93, "tp-size": "8", "enable_hierarchical_cache": True,
              "disable_cuda_graph": True, "hicache_size": None}
    assert flags.flags_diff(wanted, info) == ["enable_hierarchical_cache: wanted True, running False",
                                              "mem_fraction_static: wanted 0.93, running 0.85"]
    assert flags.flags_running({"tp-size": 8}, info) == {"tp_size": 8}
    assert flags.flags_diff({"mem_fraction_static": 0.85, "tp_size": 8}, info) == []
