"""When each play and task of an ansible-playbook run started, for `bench/run fleet --task-times`:
one JSON line per event to the file BENCH_TASK_TIMES names (nothing without it). A task's time
is the gap to the next event, so it includes its workers and their results (issue 31 item 5:
which steps of reclaim.yml cost what)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: bench_task_times
type: aggregate
short_description: when each play and task started (bench/run fleet --task-times)
description: One JSON line per play and task start, and one at the run's end, to $BENCH_TASK_TIMES.
requirements: [enabled in callbacks_enabled]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'bench_task_times'
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super(CallbackModule, self).__init__()
        self._path = os.environ.get('BENCH_TASK_TIMES')

    def _event(self, kind, name):
        if self._path:
            with open(self._path, 'a') as handle:
                handle.write(json.dumps({'t': time.monotonic(), 'kind': kind, 'name': name}) + '\n')

    def v2_playbook_on_play_start(self, play):
        self._event('play', play.get_name())

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._event('task', task.get_name())

    def v2_playbook_on_stats(self, stats):
        self._event('end', '')
