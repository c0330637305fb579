"""bench/run fleet --task-times: the callback writes when each play and task of a real
ansible-playbook run started, and step_times turns that into the time of each step."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import benchlib as bl  # noqa: E402
import fleet_bench as fb  # noqa: E402

VENV_BIN = os.path.dirname(sys.executable)


def test_each_step_is_the_gap_to_the_next_event_and_a_repeated_name_is_numbered(tmp_path):
    path = tmp_path / "times.jsonl"
    events = [(10.0, "play", "one"), (10.5, "task", "t"), (12.0, "play", "two"), (12.1, "task", "t"), (12.4, "end", "")]
    path.write_text("".join(json.dumps({"t": t, "kind": k, "name": n}) + "\n" for t, k, n in events))
    assert fb.step_times(str(path)) == [["play: one", 0.5], ["task: t", 1.5], ["play: two", 0.1], ["task: t (2)", 0.3]]


def test_the_callback_records_every_play_and_task_of_a_real_run_in_order(tmp_path):
    playbook = tmp_path / "p.yml"
    playbook.write_text("- name: first\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - name: wait a little\n      ansible.builtin.command: sleep 0.3\n"
                        "    - name: say\n      ansible.builtin.debug: {msg: hi}\n")
    times = tmp_path / "times.jsonl"
    env = dict(os.environ, BENCH_TASK_TIMES=str(times), ANSIBLE_CALLBACKS_ENABLED="bench_task_times",
               ANSIBLE_CALLBACK_PLUGINS=os.path.join(bl.BENCH, "callback_plugins"))
    run = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                          "-e", "ansible_python_interpreter=" + sys.executable, str(playbook)],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    steps = fb.step_times(str(times))
    assert [name for name, _seconds in steps] == ["play: first", "task: wait a little", "task: say"]
    assert steps[1][1] >= 0.3, "the command's own 0.3 s is inside its step"
