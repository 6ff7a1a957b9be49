"""The argv behind the dashboard's `a`: tmux attach locally, `ssh -t` with the host's own
settings remotely, the container prefix inside the remote command, quoted once."""

import shlex

from backends.attach import attach_argv
from backends.hosts import LocalHost, SSHHost


def test_local_attach_targets_the_exact_session():
    assert attach_argv(LocalHost(), "run-1") == ["tmux", "attach-session", "-t", "=run-1"]


def test_remote_attach_carries_port_key_jump_known_hosts_and_prefix():
    bastion = SSHHost("bastion", "bastion.example.org", user="ops")
    host = SSHHost(
        "gpu1", "10.0.0.5", user="root", port=2222, jump=bastion,
        known_hosts="/tmp/kh", client_keys=["/tmp/key"], prefix=["pct", "exec", "129", "--"],
    )  # fmt: skip
    argv = attach_argv(host, "it's; $(id)")
    assert argv[:2] == ["ssh", "-t"]
    options = argv[2:-2]
    assert ["-p", "2222"] == options[options.index("-p") : options.index("-p") + 2]
    assert "UserKnownHostsFile=/tmp/kh" in options and "StrictHostKeyChecking=yes" in options
    assert options[options.index("-i") + 1] == "/tmp/key"
    assert options[options.index("-J") + 1] == "ops@bastion.example.org"
    assert argv[-2] == "root@10.0.0.5"
    # The remote command is one shell string that splits back into exactly our argv.
    assert shlex.split(argv[-1]) == ["pct", "exec", "129", "--", "tmux", "attach-session", "-t", "=it's; $(id)"]
