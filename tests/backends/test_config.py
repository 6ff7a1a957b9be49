"""The TOML config: hosts, defaults, and errors that name the key."""

from __future__ import annotations

import pytest

from backends.config import ConfigError, load_config, parse_config
from backends.hosts import LocalHost, SSHHost


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_no_config_is_one_local_host(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    config = load_config(None)
    assert [h.name for h in config.hosts] == ["local"]
    assert isinstance(config.hosts[0].make_host(), LocalHost)
    assert config.defaults.grace_s == 30.0


def test_default_place_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "trackside").mkdir()
    (tmp_path / "trackside" / "config.toml").write_text('[hosts.box]\naddress = "10.1.2.3"\n')
    assert [h.name for h in load_config(None).hosts] == ["box"]


def test_hosts_defaults_prefix_and_jump(tmp_path):
    config = load_config(
        write(
            tmp_path,
            """
[defaults]
grace_s = 5
runs_root = "/data/runs"
user = "ops"

[hosts.bastion]
address = "bastion.example.org"

[hosts.gpu1]
address = "10.0.0.5"
user = "root"
port = 2222
jump = "bastion"
prefix = "pct exec 129 --"
train_command = "/opt/venv/bin/python -m training train"
identity_file = "/keys/id"

[hosts.gpu2]
address = "10.0.0.6"
jump = "bastion"
prefix = ["docker", "exec", "trainer"]

[hosts.here]
""",
        )
    )
    gpu1 = config.host("gpu1")
    assert gpu1.prefix == ["pct", "exec", "129", "--"]
    assert gpu1.train_command == ["/opt/venv/bin/python", "-m", "training", "train"]
    assert (gpu1.user, gpu1.port, gpu1.runs_root) == ("root", 2222, "/data/runs")
    assert config.host("gpu2").user == "ops"
    assert config.defaults.grace_s == 5.0 and config.defaults.poll_ms == 1000

    hosts = config.make_hosts()
    assert isinstance(hosts["here"], LocalHost)
    gpu1_host, gpu2_host = hosts["gpu1"], hosts["gpu2"]
    assert isinstance(gpu1_host, SSHHost) and gpu1_host.port == 2222
    assert gpu1_host.client_keys == ["/keys/id"]
    assert gpu1_host.shell_command(["nvidia-smi"]) == "pct exec 129 -- nvidia-smi"
    # Both go through the one bastion connection.
    assert gpu1_host.jump is gpu2_host.jump is hosts["bastion"]


@pytest.mark.parametrize(
    "text, message",
    [
        ('[hosts.gpu1]\naddress = "h"\nport = "abc"', 'hosts.gpu1.port: expected an integer from 1 to 65535, got "abc"'),
        ('[hosts.gpu1]\naddress = "h"\nport = 70000', "hosts.gpu1.port: expected an integer from 1 to 65535, got 70000"),
        ('[hosts.gpu1]\naddress = "h"\nport = true', "hosts.gpu1.port: expected an integer from 1 to 65535, got true"),
        ('[hosts.gpu1]\naddres = "h"', "hosts.gpu1.addres: unknown setting (known: address,"),
        ('[hosts.gpu1]\naddress = ""', 'hosts.gpu1.address: expected a non-empty string, got ""'),
        ('[hosts.gpu1]\naddress = "h"\nprefix = "pct \'exec"', "hosts.gpu1.prefix: cannot split"),
        ('[hosts.gpu1]\naddress = "h"\nprefix = [1]', "hosts.gpu1.prefix: expected a list of strings or a string"),
        ('[hosts.gpu1]\naddress = "h"\ntrain_command = []', "hosts.gpu1.train_command: expected a command"),
        ('[hosts.gpu1]\naddress = "h"\njump = "nope"', 'hosts.gpu1.jump: no host named "nope"'),
        ('[hosts.a]\naddress = "a"\njump = "b"\n[hosts.b]\naddress = "b"\njump = "a"', "hosts.a.jump: jump hosts loop: a -> b -> a"),
        ('[hosts.gpu1]\nport = 22', "hosts.gpu1.port: only for remote hosts"),
        ("[hosts]\ngpu1 = 3", "hosts.gpu1: expected a table, got 3"),
        ("[defaults]\ngrace_s = -1", "defaults.grace_s: expected a number from 1 to 3600 seconds, got -1"),
        ("[defaults]\npoll_ms = 10", "defaults.poll_ms: expected an integer from 50 to 60000 ms, got 10"),
        ("[default]\ngrace_s = 1", "default: unknown table"),
        ("[hosts.gpu1\n", "not valid TOML"),
    ],
)
def test_errors_name_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert message in str(error.value)
    assert str(error.value).startswith(path)


def test_missing_explicit_config_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="--config: no such file"):
        load_config(str(tmp_path / "absent.toml"))


def test_unknown_host_names_the_choices(tmp_path):
    config = load_config(write(tmp_path, '[hosts.gpu1]\naddress = "h"'))
    with pytest.raises(ConfigError, match='no host named "gpu9" \\(configured: gpu1\\)'):
        config.host("gpu9")


async def test_a_configured_host_reaches_the_test_sshd(sshd, tmp_path):
    if not sshd.running:
        sshd.start()
    config = load_config(
        write(
            tmp_path,
            f"""
[hosts.box]
address = "127.0.0.1"
port = {sshd.port}
user = "{sshd.user}"
known_hosts = "{sshd.known_hosts}"
identity_file = "{sshd.client_key}"
prefix = ["sh", "-c", 'exec "$@"', "container"]
""",
        )
    )
    host = config.host("box").make_host()
    try:
        assert (await host.run(["printf", "%s", "a b"])).stdout == "a b"
    finally:
        await host.close()


def test_the_readmes_example_is_a_valid_config_using_every_key(tmp_path):
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    example = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    config = load_config(write(tmp_path, example))
    gpu1 = config.host("gpu1")
    assert gpu1.prefix == ["pct", "exec", "129", "--"] and gpu1.jump == "bastion" and gpu1.user == "root"
    assert config.defaults.poll_ms == 1000
    # Every key the config accepts appears in the example, so the README tells them all.
    from backends import config as module

    for key in {*module.DEFAULTS_SCHEMA, *module.HOST_SCHEMA}:
        assert f"\n{key} = " in example, key


def test_record_is_a_boolean_a_host_takes_from_defaults_and_says_whether_its_recorder_starts():
    config = parse_config({"defaults": {"record": False}, "hosts": {"a": {}, "b": {"record": True}}})
    assert [h.record for h in config.hosts] == [False, True]
    hosts = config.make_hosts()
    assert hosts["a"].on_reach is None and hosts["b"].on_reach is not None
    assert parse_config({}).make_hosts()["local"].on_reach is not None
    with pytest.raises(ConfigError, match=r'hosts.a.record: expected true or false, got "no"'):
        parse_config({"hosts": {"a": {"record": "no"}}})
