"""`clusterctl data prepare` through CliRunner and the real entry point: output, files, errors, exit codes."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from clirun import clusterctl

from clusterctl.cli import cli
from clusterctl.data.shards import read_manifest


def test_prepare_embedded_writes_shards_and_a_summary(tmp_path):
    out = tmp_path / "data"
    r = CliRunner().invoke(cli, ["data", "prepare", "embedded:300", "--world", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    m = read_manifest(str(out))
    assert m.world_size == 2 and m.source == "embedded:300"
    assert r.output.splitlines()[0] == (f"{out}: 2 shards of {m.tokens_per_shard:,} uint16 tokens (byte tokenizer, "
                                        f"vocab 257), val.bin {m.val.tokens:,} tokens, {m.dropped_tokens:,} dropped")
    assert "tokens/s" in r.output.splitlines()[1] and "tokenizing" not in r.output   # no bar off a TTY


def test_prepare_jsonl_with_json_output(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document number {i}"}) + "\n" for i in range(50)))
    r = CliRunner().invoke(cli, ["data", "prepare", str(corpus), "--world", "3", "--out", str(tmp_path / "d"),
                                 "--val-fraction", "0.1", "--json"])
    assert r.exit_code == 0, r.output
    printed = json.loads(r.output)
    assert printed == json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert printed["world_size"] == 3 and printed["source"] == str(corpus) and printed["val"]["tokens"] > 0


@pytest.mark.parametrize("args,message", [
    (["/nonexistent/corpus.txt", "--world", "2"], "error: /nonexistent/corpus.txt: no such file or directory"),
    (["embedded:10", "--world", "0"], "error: world size must be a whole number >= 1, not 0"),
    (["s3://bucket/x", "--world", "2"], "error: s3://bucket/x: unknown source kind"),
    (["embedded:1", "--world", "5000", "--val-fraction", "0"], "cannot fill 5000 shards"),
    (["embedded:10", "--world", "2", "--tokenizer", "/nonexistent/tokenizer.json"],
     "error: /nonexistent/tokenizer.json: no such tokenizer file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    r = clusterctl("data", "prepare", *args, "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_empty_corpus_and_missing_options(tmp_path):
    (tmp_path / "empty.txt").write_text("\n")
    r = clusterctl("data", "prepare", str(tmp_path / "empty.txt"), "--world", "2", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.endswith("empty corpus (no documents with text)\n")
    r = clusterctl("data", "prepare", "embedded")
    assert r.returncode == 2 and "Missing option '--world'" in r.stderr
    assert not os.path.exists(tmp_path / "o") or os.listdir(tmp_path / "o") == []


def test_progress_bars_only_on_a_terminal(tmp_path):
    import pty
    master, slave = pty.openpty()
    r = subprocess.run([sys.executable, "-m", "clusterctl", "data", "prepare", "embedded:3000", "--world", "2",
                        "--out", str(tmp_path / "d")], stdout=subprocess.PIPE, stderr=slave, text=True, timeout=120)
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:       # EIO: the terminal's other side is closed and everything is read
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    assert r.returncode == 0 and "shards of" in r.stdout
    assert b"tokenizing" in drawn and b"writing shards" in drawn and b"100%" in drawn
