"""ssh_config resolution against OpenSSH's ``ssh -G -F FILE HOST`` (issue 9 item 21).

A corpus of configs (Host wildcards and negation, Match host/originalhost/user/localuser/exec/
final/canonical/all, negated criteria, Include, Host blocks after Match, ``Keyword=value``,
quotes, ProxyJump vs ProxyCommand) is resolved by the real ssh client and by gpuctl, and
HostName, User, Port, IdentityFile, IdentitiesOnly and ProxyJump are compared field by field.
Configs ssh refuses are refused by gpuctl too, with file:line.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuctl.transport import TransportError, open_transport, sshconfig
from gpuctl.transport.sshconfig import SshConfigError, load_config, resolve_host

HAVE_SSH = shutil.which("ssh") is not None
LOCAL = pwd.getpwuid(os.getuid()).pw_name

needs_ssh = pytest.mark.skipif(not HAVE_SSH, reason="needs OpenSSH's ssh client")


def ssh_g(cfg: Path, host: str) -> dict[str, list[str]]:
    """``ssh -G -F cfg host`` as {keyword: [values]}; raises CalledProcessError when ssh refuses."""
    out = subprocess.run(["ssh", "-G", "-F", str(cfg), host], capture_output=True, text=True, check=True,
                         timeout=20, stdin=subprocess.DEVNULL).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key, []).append(value)
    return found


def compare(cfg: Path, host: str) -> None:
    """Assert gpuctl resolves `host` through `cfg` as ``ssh -G`` does, field by field."""
    ref = ssh_g(cfg, host)
    ours = resolve_host(host, config_path=str(cfg))
    where = f"{cfg.name} {host}"
    assert ours.hostname == ref["hostname"][0], where
    assert ours.user == ref["user"][0], where
    assert str(ours.port) == ref["port"][0], where
    assert ("yes" if ours.identities_only else "no") == ref["identitiesonly"][0], where
    assert ",".join(ours.proxy_jump) == ref.get("proxyjump", [""])[0], where
    if ours.identity_files_given:
        assert list(ours.identity_files) == [os.path.expanduser(p) for p in ref["identityfile"]], where
    else:  # ssh lists its defaults; gpuctl tries the same ones (those that exist)
        defaults = [os.path.expanduser(p) for p in ref["identityfile"]]
        assert set(ours.identity_files) <= set(defaults), where


CORPUS: dict[str, tuple[str, tuple[str, ...]]] = {
    "host-wildcards": (
        """
        Host *.prod !bastion.prod
          User produser
        Host gpu??
          Port 2222
        Host gpu1*
          HostName %h.example.com
        Host *
          User default
          IdentityFile ~/.ssh/k_all
          IdentityFile ~/.ssh/k_all
        """,
        ("a.prod", "bastion.prod", "gpu12", "gpu1", "other", "GPU12"),
    ),
    "match-final-all": (
        """
        Host gpu*
          HostName 10.9.0.1
        Match final all
          ProxyJump jump@bastion:2200
          IdentitiesOnly yes
        Host 10.9.*
          User ipuser
        """,
        ("gpu1", "127.0.0.1", "other"),
    ),
    "match-host-originalhost": (
        """
        Host web
          HostName web.internal
        Match host web.internal
          Port 2201
        Match originalhost web !host other*
          User weborig
        Match !host *.internal
          IdentityFile ~/.ssh/not_internal
        Match host !foo
          Port 9999
        Match host "a*,!ab*"
          User a_not_ab
        Match originalhost WEB
          IdentitiesOnly yes
        """,
        ("web", "ab1", "ac1", "foo", "WEB"),
    ),
    "match-user-localuser": (
        f"""
        Host u1
          User ops
        Match user ops
          Port 2300
        Match localuser {LOCAL}
          IdentitiesOnly yes
        Match !localuser {LOCAL}
          Port 1
        Match user {LOCAL},nobody
          ProxyJump hop1,hop2:2222
        """,
        ("u1", "u2"),
    ),
    "match-exec": (
        """
        Match exec "test %h = e1"
          User exec1
        Match host nope exec "touch {dir}/should-not-run"
          User never
        Match !exec "exit 3"
          Port 2400
        Match exec false
          Port 1
        Match exec "test %n = e2" exec "test %r = {local}"
          IdentityFile ~/.ssh/e2
        """,
        ("e1", "e2"),
    ),
    "final-canonical": (
        """
        Host f*
          HostName F-Host.example
        Match canonical host f-host.example
          User canon
        Match final host f-host.example
          Port 2500
        Match !final
          IdentityFile ~/.ssh/first_pass
        Match final
          IdentityFile ~/.ssh/final_pass
        Host f-host.example
          IdentitiesOnly yes
        """,
        ("f1", "g1"),
    ),
    "canonical-without-final": (
        """
        Match canonical
          Port 2600
        Match !canonical
          User not_canonical
        """,
        ("x",),
    ),
    "include": (
        """
        Include {dir}/inc/*.conf
        Host gpu*
          Include {dir}/inner.conf
          User gpuuser
        Host *
          Port 2700
        """,
        ("gpu2", "gpu3", "other"),
    ),
    "host-after-match-syntax": (
        """
        Match all
          User=alluser
        Host q "with space"   # a comment
          Port=2800
        HOST Q2
          hostname = q2.example
        Match host q2.example
          IdentitiesOnly=yes
        Host=eq
          Port 2801 # a trailing comment
          ProxyJump ops@hop:2022 # a comment
        host\tTAB
          port\t2802
        """,
        ("q", "Q2", "q2", "eq", "TAB"),
    ),
    "proxyjump-proxycommand": (
        """
        Host pc
          ProxyCommand nc %h %p
          ProxyJump j1
        Host pj
          ProxyJump j2
          ProxyCommand nc %h %p
        Host pn
          ProxyJump none
        Host *
          ProxyJump ops@j3:2222
        """,
        ("pc", "pj", "pn", "zz"),
    ),
}

INCLUDED = {
    "inc/a.conf": "Match host gpu2\n  User from_a\n",
    "inc/b.conf": "Host gpu3\n  IdentityFile ~/.ssh/b_key\n",
    "inner.conf": "Match final\n  ProxyJump inner_jump\nHost never\n  User never\n",
}


def write_corpus(tmp_path: Path, name: str) -> Path:
    text, _ = CORPUS[name]
    for rel, body in INCLUDED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    cfg = tmp_path / f"{name}.config"
    body = "\n".join(line.strip() if not line.startswith("          ") else "  " + line.strip()
                     for line in text.strip("\n").splitlines())
    cfg.write_text(body.replace("{dir}", str(tmp_path)).replace("{local}", LOCAL) + "\n")
    return cfg


@needs_ssh
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_resolution_matches_ssh_G(tmp_path, name):
    cfg = write_corpus(tmp_path, name)
    for host in CORPUS[name][1]:
        compare(cfg, host)
    assert not (tmp_path / "should-not-run").exists()  # exec after a failed criterion never runs


def test_match_final_all_applies_to_every_host(tmp_path):
    """paramiko raised on this valid line and failed every node."""
    cfg = write_corpus(tmp_path, "match-final-all")
    far = resolve_host("gpu1", config_path=str(cfg))
    assert (far.hostname, far.user, far.proxy_jump, far.identities_only) == (
        "10.9.0.1", "ipuser", ("jump@bastion:2200",), True)
    by_address = resolve_host("127.0.0.1", config_path=str(cfg))
    assert by_address.hostname == "127.0.0.1" and by_address.proxy_jump == ("jump@bastion:2200",)


def test_values_of_corpus_are_real(tmp_path):
    """Spot checks that the corpus exercises what it claims (not just two empty resolutions)."""
    cfg = write_corpus(tmp_path, "match-host-originalhost")
    web = resolve_host("web", config_path=str(cfg))
    assert (web.hostname, web.port, web.user) == ("web.internal", 2201, "weborig")
    assert resolve_host("ac1", config_path=str(cfg)).user == "a_not_ab"
    assert resolve_host("foo", config_path=str(cfg)).port == 22  # "host !foo" alone never matches
    cfg = write_corpus(tmp_path, "final-canonical")
    f1 = resolve_host("f1", config_path=str(cfg))
    assert (f1.hostname, f1.user, f1.port, f1.identities_only) == ("f-host.example", "canon", 2500, True)
    assert f1.identity_files == tuple(os.path.expanduser(p) for p in ("~/.ssh/first_pass", "~/.ssh/final_pass"))
    cfg = write_corpus(tmp_path, "include")
    gpu3 = resolve_host("gpu3", config_path=str(cfg))
    assert (gpu3.user, gpu3.port, gpu3.proxy_jump) == ("gpuuser", 2700, ("inner_jump",))
    assert resolve_host("gpu2", config_path=str(cfg)).user == "from_a"
    assert resolve_host("other", config_path=str(cfg)).proxy_jump == ()
    cfg = write_corpus(tmp_path, "match-exec")
    e2 = resolve_host("e2", config_path=str(cfg))
    assert (e2.user, e2.port, e2.identity_files) == (LOCAL, 2400, (os.path.expanduser("~/.ssh/e2"),))


def test_identity_file_tokens_expanded(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("Host t\n  HostName T.Example\n  User ops\n  Port 2022\n  IdentityFile ~/.ssh/%h-%r-%p-%n-%%.key\n")
    t = resolve_host("t", config_path=str(cfg))
    assert t.identity_files == (os.path.expanduser("~/.ssh/t.example-ops-2022-t-%.key"),)
    cfg.write_text("Host t\n  IdentityFile ~/.ssh/%z\n")
    with pytest.raises(SshConfigError, match=rf"{cfg}:2: IdentityFile: unknown token %z"):
        resolve_host("t", config_path=str(cfg))


# ---- refusals: every criterion gpuctl cannot evaluate is refused with file:line, as ssh does ----

REFUSED = {
    "Match localnetwork 10.0.0.0/8\n  ProxyJump evil\n": (1, "Match criterion 'localnetwork' cannot be evaluated"),
    "Host a\n  Port 3\nMatch tagged x\n  ProxyJump evil\n": (3, "Match criterion 'tagged' cannot be evaluated"),
    "Match host a foo bar\n  User x\n": (1, "Match criterion 'foo' cannot be evaluated"),
    "Match all host x\n  User x\n": (1, "Match 'all' cannot be combined"),
    "Match canonical final all\n  User x\n": (1, "Match 'all' cannot be combined"),
    "Match host\n  User x\n": (1, "Match host needs an argument"),
    "Match\n  User x\n": (1, "no argument after keyword 'Match'"),
    "Host x\n  User \"unterminated\n": (2, "invalid quotes"),
    "Host other\n  Port nope\n": (2, "Port 'nope' is not a number"),
    "Host other\n  ProxyJump a@b:xx\n": (2, "invalid ProxyJump"),
    "Host other\n  IdentitiesOnly maybe\n": (2, "identitiesonly must be yes or no"),
    "Host other\n  ProxyJump \"ops@hop:2022\"\n": (2, "invalid ProxyJump"),  # ssh keeps the quotes
}


@pytest.mark.parametrize("text", sorted(REFUSED))
def test_refused_like_ssh_with_file_and_line(tmp_path, text):
    lineno, message = REFUSED[text]
    cfg = tmp_path / "config"
    cfg.write_text(text)
    for host in ("a", "127.0.0.1"):
        with pytest.raises(SshConfigError) as info:
            resolve_host(host, config_path=str(cfg))
        assert str(info.value).startswith(f"{cfg}:{lineno}: "), str(info.value)
        assert message in str(info.value)
        if HAVE_SSH:
            with pytest.raises(subprocess.CalledProcessError):
                ssh_g(cfg, host)


def test_refusal_in_included_file_names_both_places(tmp_path):
    (tmp_path / "bad.conf").write_text("# bad\nMatch localnetwork 10.0.0.0/8\n  ProxyJump evil\n")
    cfg = tmp_path / "config"
    cfg.write_text(f"Host *\n  User u\nInclude {tmp_path}/bad.conf\n")
    with pytest.raises(SshConfigError) as info:
        load_config(str(cfg))
    assert str(info.value).startswith(f"{tmp_path}/bad.conf:2: Match criterion 'localnetwork'")
    assert f"included from {cfg}:3" in str(info.value)


def test_exec_that_hangs_is_refused_naming_the_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sshconfig, "EXEC_TIMEOUT_S", 0.3)
    cfg = tmp_path / "config"
    cfg.write_text("Host *\n  User u\nMatch exec \"sleep 5\"\n  ProxyJump evil\n")
    with pytest.raises(SshConfigError, match=rf"^{cfg}:3: Match exec 'sleep 5' did not finish in 0.3 s"):
        resolve_host("a", config_path=str(cfg))


def test_canonicalize_hostname_refused_only_for_hosts_it_applies_to(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("Host canon\n  CanonicalizeHostname yes\nHost *\n  CanonicalizeHostname no\n  User u\n")
    with pytest.raises(SshConfigError, match=rf"^{cfg}:2: CanonicalizeHostname yes cannot be evaluated"):
        resolve_host("canon", config_path=str(cfg))
    assert resolve_host("plain", config_path=str(cfg)).user == "u"


def test_bad_config_fails_node_by_address_with_file_and_line(tmp_path):
    """As with ssh -G, a bad line fails every host, but the message names the file and line."""
    cfg = tmp_path / "config"
    cfg.write_text("Host elsewhere\n  HostName x\nMatch localnetwork 10.0.0.0/8\n  ProxyJump evil\n")
    node = SimpleNamespace(name="n1", host="127.0.0.1", user=None, port=None, identity_file=None, socket=None,
                           transport="ssh", gpuctld="gpuctld", timeout_s=5.0)
    t = open_transport(node, ssh_config_path=str(cfg))
    try:
        with pytest.raises(TransportError) as info:
            t.http_client().get("/v1/health")
        assert str(info.value).startswith(f"node n1 (127.0.0.1): {cfg}:3: Match criterion 'localnetwork'")
        assert info.value.code == "config"
        assert t.connections_opened == 0
    finally:
        t.close()


# ---- generated configs: many combinations of the same grammar, each checked against ssh -G ----

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    st = None

if st is not None:
    NAMES = ("gpu1", "gpu2", "web", "10.0.0.5", "Gpu1")
    HOST_PATTERNS = ("gpu*", "gpu?", "web", "!gpu2", "*", "10.0.0.*", "!web", "Gpu*", "*.x")
    CRITERIA = st.one_of(
        st.tuples(st.sampled_from(["host", "originalhost", "!host", "!originalhost"]),
                  st.lists(st.sampled_from(["gpu*", "web", "!gpu2", "10.0.0.*", "*.x", "GPU1", "h*"]),
                           min_size=1, max_size=3).map(",".join)),
        st.tuples(st.sampled_from(["user", "!user", "localuser", "!localuser"]),
                  st.sampled_from([LOCAL, "ops", "ops,!root", "u*"])),
        st.tuples(st.sampled_from(["exec", "!exec"]), st.sampled_from(["true", "false", '"test %h = web"'])),
        st.tuples(st.sampled_from(["final", "!final", "canonical", "!canonical"]), st.just("")),
    )
    DIRECTIVES = st.sampled_from([
        "HostName %h.x", "HostName 10.0.0.5", "HostName WEB", "User ops", "User dev", "Port 2201", "Port 2202",
        "IdentityFile ~/.ssh/k1", "IdentityFile ~/.ssh/k2", "IdentitiesOnly yes", "IdentitiesOnly no",
        "ProxyJump hop1", "ProxyJump ops@hop2:2022,hop3", "ProxyJump none", "ProxyCommand nc %h %p",
    ])

    def _header(kind: str, data) -> str:
        if kind == "host":
            return "Host " + " ".join(data)
        criteria, all_form = data
        if all_form:  # "all" stands alone or after one of final/canonical
            return "Match " + all_form
        return "Match " + " ".join(f"{name} {arg}".strip() for name, arg in criteria)

    BLOCK = st.one_of(
        st.tuples(st.just("host"), st.lists(st.sampled_from(HOST_PATTERNS), min_size=1, max_size=3)),
        st.tuples(st.just("match"), st.tuples(
            st.lists(CRITERIA, min_size=1, max_size=3),
            st.sampled_from(["", "", "", "all", "!all", "final all", "!final all", "canonical all", "final !all"]))),
    ).map(lambda kd: _header(*kd))
    CONFIG = st.lists(st.tuples(BLOCK, st.lists(DIRECTIVES, max_size=3)), min_size=1, max_size=6)

    @needs_ssh
    @settings(max_examples=120, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(blocks=CONFIG, top=st.lists(DIRECTIVES, max_size=2))
    def test_generated_configs_match_ssh_G(tmp_path, blocks, top):
        cfg = tmp_path / "generated.config"
        lines = list(top)
        for header, directives in blocks:
            lines.append(header)
            lines.extend("  " + d for d in directives)
        cfg.write_text("\n".join(lines) + "\n")
        for host in NAMES:
            try:
                compare(cfg, host)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- config ---\n{cfg.read_text()}") from None
