"""The Ansible inventory of the running nodes."""

import os

from . import paths


def write(records):
    """Write the INI inventory for these nodes, or remove it when there are none."""
    if not records:
        try:
            os.unlink(paths.INVENTORY)
        except FileNotFoundError:
            pass
        return None
    lines = ["[gpu_nodes]"]
    lines += [f"{r['name']} ansible_host={r['ip']}" for r in records]
    lines += [
        "",
        "[gpu_nodes:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={paths.SSH_KEY}",
        "ansible_python_interpreter=/usr/bin/python3",
        "ansible_host_key_checking=false",
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'",
        "",
    ]
    os.makedirs(paths.RUN, exist_ok=True)
    tmp = paths.INVENTORY + ".new"
    with open(tmp, "w") as f:
        f.write("\n".join(lines))
    os.replace(tmp, paths.INVENTORY)
    return paths.INVENTORY
