import os
import sys
import textwrap

import pytest

from clusterctl.errors import InventoryError
from clusterctl.inventory import Cluster, load, parse
from clusterctl.inventory_load import load_cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FULL = """\
defaults:                 # merged into every host; a host's own keys win
  user: alice
  port: 22
  identity_file: keys/id_ed25519
  python: /opt/homebrew/Caskroom/miniforge/base/envs/mlx/bin/python
  workdir: ~/clusterctl
  mpi_lib_dir: /opt/homebrew/lib
  env: {MLX_METAL_FAST_SYNCH: "0", SHARED: base}
hosts:
  - name: studio-1
    address: 192.168.10.1
  - name: studio-2
    user: bob
    env: {SHARED: mine}
  - studio-3
mpi: {btl_tcp_links: 2, if_include: 192.168.10.0/24, extra_args: ["--mca", "btl_tcp_eager_limit", "65536"]}
launch: {backend: ring}
host_key_checking: strict
"""


def test_full_inventory_merges_defaults_and_keeps_rank_order():
    c = parse(FULL, "/etc/cl/inventory.yaml")
    assert isinstance(c, Cluster)
    assert [h.name for h in c.hosts] == ["studio-1", "studio-2", "studio-3"]
    assert [h.rank for h in c.hosts] == [0, 1, 2]
    s1, s2, s3 = c.hosts
    assert (s1.user, s2.user, s3.user) == ("alice", "bob", "alice")
    assert s1.address == "192.168.10.1" and s2.address is None
    assert s1.identity_file == "/etc/cl/keys/id_ed25519"   # relative to the inventory's directory
    assert s1.workdir == "~/clusterctl"                      # remote path: ~ is the host's home, kept
    assert s1.env_dict == {"MLX_METAL_FAST_SYNCH": "0", "SHARED": "base"}
    assert s2.env_dict == {"MLX_METAL_FAST_SYNCH": "0", "SHARED": "mine"}
    assert s1.line == 10 and s3.line == 15
    assert c.mpi.btl_tcp_links == 2 and c.mpi.if_include == "192.168.10.0/24"
    assert c.mpi.extra_args == ("--mca", "btl_tcp_eager_limit", "65536")
    assert c.launch.backend == "ring" and c.host_key_checking == "strict"
    assert c.world_size == 3


def test_ansible_aliases_map_to_our_keys():
    c = parse(textwrap.dedent("""\
        hosts:
          - name: m1
            ansible_host: 10.0.0.5
            ansible_port: 2222
            ansible_user: carol
            ansible_ssh_private_key_file: /k/id
            ansible_python_interpreter: /usr/bin/python3.12
        """), "inv.yaml")
    h = c.hosts[0]
    assert (h.hostname, h.port, h.user, h.identity_file, h.python) == \
        ("10.0.0.5", 2222, "carol", "/k/id", "/usr/bin/python3.12")


def test_unset_ssh_settings_stay_unset_for_ssh_config_to_fill():
    h = parse("hosts: [m1]\n", "inv.yaml").hosts[0]
    assert (h.user, h.port, h.identity_file) == (None, None, None)
    assert (h.python, h.workdir) == ("python3", "~/clusterctl")


def test_slots_give_consecutive_ranks_and_local_defaults_to_this_python():
    c = parse("hosts:\n  - {name: localhost, local: true, slots: 2}\n  - {name: b, slots: 3}\n", "i.yaml")
    assert [list(h.ranks) for h in c.hosts] == [[0, 1], [2, 3, 4]]
    assert c.world_size == 5
    assert c.hosts[0].local and c.hosts[0].python == sys.executable


def test_yaml_merge_keys_work_and_own_keys_win():
    c = parse(textwrap.dedent("""\
        hosts:
          - &base {name: a, user: u, port: 2200}
          - <<: *base
            name: b
            port: 2201
        """), "i.yaml")
    assert (c.hosts[1].name, c.hosts[1].user, c.hosts[1].port) == ("b", "u", 2201)


def test_env_merge_keys_are_overridden_not_duplicates():
    c = parse(textwrap.dedent("""\
        defaults:
          env: &e {A: '1', B: '2'}
        hosts:
          - name: a
            env:
              <<: *e
              B: '3'
        """), "i.yaml")
    assert c.hosts[0].env_dict == {"A": "1", "B": "3"}


def test_shipped_inventories_are_valid():
    local = load(os.path.join(REPO, "inventory", "local.yaml"))
    assert local.world_size == 2 and all(h.local for h in local.hosts)
    macs = load(os.path.join(REPO, "inventory", "example-macs.yaml"))
    assert len(macs.hosts) == 4 and all(h.address for h in macs.hosts)


TWO_MACS = """\
hosts:
  - {name: a, address: 10.0.0.1, rdma: [null, rdma_en2]}
  - {name: b, address: 10.0.0.2, rdma: [rdma_en2, null]}
launch: {backend: jaccl}
"""

# (inventory text, expected line, expected words in the message)
MALFORMED = [
    ("", 1, "empty"),
    ("# only a comment\n", 1, "empty"),
    ("- a\n- b\n", 1, "must be a mapping"),
    ("defaults: {user: a}\n", 1, "no `hosts:` list"),
    ("hosts:\n", 1, "must be a list"),
    ("hosts: []\n", 1, "`hosts` is empty"),
    ("hosts: studio-1\n", 1, "must be a list"),
    ("hosts:\n  - name: a\n    prot: 22\n", 3, "unknown key 'prot' in a host entry (did you mean 'port'?)"),
    ("hosts:\n  - name: a\n  - name: b\n  - name: a\n", 4, "duplicate host name 'a' (first at line 2)"),
    ("hosts:\n  - name: a\n    port: 70000\n", 3, "port must be a whole number from 1 to 65535"),
    ("hosts:\n  - name: a\n    port: 0\n", 3, "port must be a whole number from 1 to 65535"),
    ("hosts:\n  - name: a\n    port: '22'\n", 3, "port must be a whole number"),
    ("hosts:\n  - name: a\n    port: yes\n", 3, "not the boolean true"),
    ("hosts:\n  - name: a\n    port: [22]\n", 3, "to 65535, not a list"),
    ("hosts:\n  - user: bob\n", 2, "has no `name`"),
    ("hosts:\n  - name: 5\n", 2, "host name must be a string"),
    ("hosts:\n\t- name: a\n", 2, "tab character"),
    ("hosts:\n  - name: a\n    user: [x\n", 4, "YAML syntax error"),
    ("hosts:\n  - name: a\n  user: b\n  - c\n", 3, "check the indentation"),
    ("hosts:\n  - name: a\n    address: 10.0.0.300\n", 3, "IPv4 address"),
    ("hosts:\n  - name: a\n    address: fe80::1\n", 3, "IPv4 address"),
    ("hosts:\n  - name: a\n    env: {1BAD: x}\n", 3, "not a valid variable name"),
    ("hosts:\n  - name: a\n    env: {GOOD: [1, 2]}\n", 3, "env value of GOOD must be a string"),
    ("hosts:\n  - name: a\n    env: [A=1]\n", 3, "env must be a mapping"),
    ("hosts:\n  - name: a\n    slots: 0\n", 3, "slots must be a whole number from 1"),
    ("hosts:\n  - name: a\n    local: maybe\n", 3, "local must be true or false"),
    ("hosts:\n  - name: -oProxyCommand=evil\n", 2, "must not start with '-'"),
    ("hosts:\n  - name: 'two words'\n", 2, "must not contain spaces"),
    ("hosts:\n  - name: 'a;touch${IFS}x'\n", 2, "a character OpenSSH refuses in host names (;)"),
    ("hosts:\n  - name: a\n    ansible_host: '$(reboot)'\n", 3, "OpenSSH refuses in host names ($)"),
    # issue 25 item 8
    ("hosts:\n  - name: a\n    python: !!python/name:os.system\n", 3, "the YAML tag !!python/name:os.system is not allowed"),
    ("hosts:\n  - name: 'fe80::1'\n", 2, "holds ':': give the host a name and put its address under `address:`"),
    ("hosts:\n  - name: '../../x'\n", 2, "must not contain '/' or be '.' or '..'"),
    ("hosts:\n  - name: '..'\n", 2, "must not contain '/' or be '.' or '..'"),
    ("hosts:\n  - name: 'a\u200bb'\n", 2, "an invisible or unassigned character (U+200B)"),
    ("hosts:\n  - name: a\n    user: b\n    ansible_user: c\n", 4, "'ansible_user' and 'user' both set user"),
    ("hosts:\n  - name: a\n    port: 22\n    port: 23\n", 4, "duplicate key 'port'"),
    ("hosts: [a]\nhosts: [b]\n", 2, "duplicate key 'hosts'"),
    ("hosts:\n  - name: a\n    env:\n      X: '1'\n      X: '2'\n", 5, "duplicate key 'X' in env"),
    ("defaults:\n  name: x\nhosts: [a]\n", 2, "unknown key 'name' in defaults"),
    ("defaults: [user, bob]\nhosts: [a]\n", 1, "defaults must be a mapping"),
    ("hosts: [a]\nmpi: {btl_tcp_links: many}\n", 2, "mpi.btl_tcp_links must be a whole number"),
    ("hosts: [a]\nmpi: {if_include: 10.0.0.0/33}\n", 2, "is not a subnet"),
    ("hosts: [a]\nmpi: {extra_args: --mca x}\n", 2, "extra_args must be a list"),
    ("hosts: [a]\nlaunch: {backend: nccl}\n", 2, "launch.backend must be one of mpi, ring, jaccl"),
    ("hosts: [a]\nhost_key_checking: 'no'\n", 2, "never turns host key checking off"),
    ("hosts: [a]\nssh_config: /nonexistent/ssh_config\n", 2, "does not exist"),
    ("hosts: [a]\nextra: 1\n", 2, "unknown key 'extra' in the inventory"),
    ("hosts: [a]\n---\nhosts: [b]\n", 2, "YAML syntax error"),
    ("hosts:\n  - name: a\n    workdir: ''\n", 3, "workdir must not be empty"),
    # rdma: MLX's per-rank device list (docs/facts/macos.md#jaccl)
    (TWO_MACS.replace("[null, rdma_en2]", "rdma_en2"), 2, "rdma must be a list with one entry per rank"),
    (TWO_MACS.replace("[null, rdma_en2]", "[null]"), 2, "rdma of a has 1 entries; expected 2, one per rank"),
    (TWO_MACS.replace("[null, rdma_en2]", "[rdma_en3, rdma_en2]"), 2, "rdma entry 0 is a's own rank: it must be null"),
    (TWO_MACS.replace("[null, rdma_en2]", "[null, 'en 2']"), 2, "rdma entry 1 (rank 1) must be a device name such as"),
    (TWO_MACS.replace("[null, rdma_en2]", "[null, [rdma_en2, 7]]"), 2, "not the number 7"),
    (TWO_MACS.replace("[null, rdma_en2]", "[null, []]"), 2, "or null, not an empty list"),
    (TWO_MACS.replace("a, address: 10.0.0.1, ", "a, "), 2, "rdma needs a's data-plane `address` too"),
    ("defaults: {rdma: [null]}\nhosts: [a]\n", 1, "unknown key 'rdma' in defaults"),
    # with the jaccl backend (checked by clusterctl.launch.backends, still at the inventory's line)
    (TWO_MACS.replace("[null, rdma_en2]", "[null, null]"), 2, "rdma of a has no device for b (entry 1): the jaccl "
     "backend needs one between every pair of hosts"),
    (TWO_MACS.replace(", rdma: [rdma_en2, null]", ""), 3, "b has no `rdma:` list, which the jaccl backend needs: add"),
    (TWO_MACS.replace("rdma: [rdma_en2, null]", "slots: 2, rdma: [rdma_en2, null, null]").replace(
        "[null, rdma_en2]", "[null, rdma_en2, rdma_en2]"), 3, "b has slots: 2, but the jaccl backend runs one rank per Mac"),
]


@pytest.mark.parametrize("text,line,words", MALFORMED, ids=[f"{i:02d}" for i in range(len(MALFORMED))])
def test_malformed_inventory_names_file_and_line(text, line, words, tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError) as info:
        load_cluster(str(path))       # as every command reads it (the backend's name is checked there)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert words in message, message
    assert "\n" not in message
    assert info.value.exit_code == 2


@pytest.mark.parametrize("make,words", [
    (lambda p: None, "no such inventory file"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b"hosts: [\xff]\n"), "not UTF-8"),
])
def test_unreadable_inventory_is_one_line(tmp_path, make, words):
    path = tmp_path / "inventory.yaml"
    make(path)
    with pytest.raises(InventoryError) as info:
        load(path)
    assert str(info.value) == f"{path}: {info.value.message}" and words in str(info.value)


def test_secret_env_values_are_marked_by_name_or_by_the_secret_tag_and_scrubbed(tmp_path):
    """docs/security.md#where-secrets-go: a name that looks secret or `!secret` keeps a value out of records."""
    from clusterctl.inventory import REDACTED, is_secret, scrub
    cluster = parse("defaults:\n  env: {HF_TOKEN: hf_abc123, MY_URL: !secret 'https://u:pw@x', PLAIN: plain1}\n"
                    "hosts:\n  - {name: a, env: {OWN: !secret own-value}}\n  - {name: b}\n", str(tmp_path / "i.yaml"))
    a, b = cluster.hosts
    assert a.env_dict == {"HF_TOKEN": "hf_abc123", "MY_URL": "https://u:pw@x", "PLAIN": "plain1", "OWN": "own-value"}
    assert (a.secret_env, b.secret_env) == (("MY_URL", "OWN"), ("MY_URL",))
    assert cluster.secrets == ["https://u:pw@x", "hf_abc123", "own-value"]        # longest first
    for name in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "github_pat_token", "DB_PASSWORD"):
        assert is_secret(name)
    assert not any(is_secret(n) for n in ("PATH", "MLX_RANK", "DYLD_LIBRARY_PATH", "KEYBOARD"))
    record = {"argv": ["mlx.launch", "--env", "HF_TOKEN=hf_abc123"], "env": {"PLAIN": "plain1", "OWN": "own-value"}}
    assert scrub(record, cluster.secrets) == {"argv": ["mlx.launch", "--env", f"HF_TOKEN={REDACTED}"],
                                              "env": {"PLAIN": "plain1", "OWN": REDACTED}}
    with pytest.raises(InventoryError, match=r"i2.yaml:2: the YAML tag !secret is not allowed"):
        parse("defaults:\n  python: !secret /x\nhosts:\n  - {name: a}\n", str(tmp_path / "i2.yaml"))


# ---- a host key is one declaration (issue 39) -----------------------------------------------------------

TIER = '    tier: str = key("bronze", read=NodeReader.string, help="a test key: the host\'s tier")\n'


def _inventory_with(declaration: str, tmp_path, monkeypatch):
    """clusterctl/inventory.py with `declaration` added after Host's last key, imported as a module of its
    own (clusterctl.inventory itself untouched), and the diff that made it."""
    import ast
    import difflib
    import importlib.util

    import clusterctl.inventory as inventory

    source = open(inventory.__file__, encoding="utf-8").read().splitlines(keepends=True)
    host = next(n for n in ast.parse("".join(source)).body if isinstance(n, ast.ClassDef) and n.name == "Host")
    last_key = [n for n in host.body if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Call)
                and getattr(n.value.func, "id", None) == "key"][-1]
    changed = source[:last_key.end_lineno] + declaration.splitlines(keepends=True) + source[last_key.end_lineno:]
    diff = [line for line in difflib.unified_diff(source, changed, n=0) if line[0] in "+-"][2:]
    path = tmp_path / "inventory_with_a_test_key.py"
    path.write_text("".join(changed), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("clusterctl.inventory_with_a_test_key", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module, diff


def test_adding_a_host_key_is_one_declaration(tmp_path, monkeypatch):
    """One line added to Host, nothing else: the key is read from a host and from `defaults:`, with the
    precedence host > defaults > built-in, and a malformed value is refused at its file:line."""
    module, diff = _inventory_with(TIER, tmp_path, monkeypatch)
    assert diff == ["+" + TIER]
    assert "tier" in module.HOST_KEYS and "tier" in module.DEFAULTS_KEYS
    text = "defaults:\n  tier: silver\nhosts:\n  - name: a\n    tier: gold\n  - b\n"
    assert [h.tier for h in module.parse(text, "inv.yaml").hosts] == ["gold", "silver"]
    assert [h.tier for h in module.parse("hosts: [a, {name: b, tier: gold}]\n", "inv.yaml").hosts] == ["bronze", "gold"]
    with pytest.raises(InventoryError, match=r"^inv\.yaml:5: tier must be a string, not the number 5$"):
        module.parse("defaults:\n  tier: silver\nhosts:\n  - name: a\n    tier: 5\n", "inv.yaml")
    with pytest.raises(InventoryError, match=r"^inv\.yaml:2: defaults\.tier must not be empty$"):
        module.parse("defaults:\n  tier: ''\nhosts: [a]\n", "inv.yaml")
    # the inventory as it is knows no such key: the declaration is what made it one
    with pytest.raises(InventoryError, match=r"^inv\.yaml:1: unknown key 'tier' in a host entry"):
        parse("hosts: [{name: a, tier: gold}]\n", "inv.yaml")


def test_a_host_key_declared_for_hosts_only_is_refused_under_defaults(tmp_path, monkeypatch):
    declaration = ('    rack: int | None = key(None, read=whole(1, 42), in_defaults=False,\n'
                   '                           help="a test key: the rack a host sits in")\n')
    module, diff = _inventory_with(declaration, tmp_path, monkeypatch)
    assert diff == ["+" + line for line in declaration.splitlines(keepends=True)]
    assert "rack" in module.HOST_KEYS and "rack" not in module.DEFAULTS_KEYS
    assert [h.rack for h in module.parse("hosts: [a, {name: b, rack: 7}]\n", "inv.yaml").hosts] == [None, 7]
    with pytest.raises(InventoryError, match=r"^inv\.yaml:2: unknown key 'rack' in defaults"):
        module.parse("defaults:\n  rack: 3\nhosts: [a]\n", "inv.yaml")
    with pytest.raises(InventoryError, match=r"^inv\.yaml:1: rack must be a whole number from 1 to 42, not the number 43$"):
        module.parse("hosts: [{name: b, rack: 43}]\n", "inv.yaml")


def test_the_guide_lists_every_declared_host_key_and_where_it_may_be_set():
    """docs/inventory.md's host key table has a row per declared key, and says `Not in defaults` exactly for
    the keys declared for hosts only."""
    from clusterctl.inventory import DEFAULTS_KEYS, HOST_KEYS

    text = open(os.path.join(REPO, "docs", "inventory.md"), encoding="utf-8").read()
    table = text.split("## Host keys", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `")}
    assert list(rows) == list(HOST_KEYS)
    assert [k for k, row in rows.items() if "Not in `defaults`" not in row] == list(DEFAULTS_KEYS)
