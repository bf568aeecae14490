"""One settings model: defaults < a TOML file < TIERMEM_* variables < flags; unknown names refused;
bad values one line and exit 2; the effective settings logged at start; JSON logs with request ids
and an access line a call at DEBUG."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from tiermem.server.config import ServerConfig
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "tiermem.toml"
    f.write_text(
        'port = 6000\nrecency_tau_seconds = 60\nembedder = "builtin"\ntier_max_items = [0, 1, 2, 3, 4]\n'
    )
    c = ServerConfig.from_env(env={}, config_file=f)
    assert (c.port, c.recency_tau_seconds, c.tier_max_items) == (6000, 60.0, (0.0, 1.0, 2.0, 3.0, 4.0))
    c = ServerConfig.from_env(env={"TIERMEM_PORT": "6001", "TIERMEM_CONFIG": str(f)})
    assert c.port == 6001 and c.recency_tau_seconds == 60.0  # the variable over the file
    c = ServerConfig.from_env(env={"TIERMEM_PORT": "6001"}, config_file=f, port=6002)
    assert c.port == 6002  # the flag over both


@pytest.mark.parametrize(
    "env,content,message",
    [
        ({"TIERMEM_EMBEDER": "openai"}, None, r"TIERMEM_EMBEDER.*did you mean TIERMEM_EMBEDDER"),
        ({}, "portt = 1\n", r"unknown setting portt in .*tiermem.toml"),
        ({}, 'port = "many"\n', r"setting port .* not a valid int"),
        ({}, "port = \n", r"not TOML"),
        ({}, 'tier_max_items = [2000, 500, "x", 100]\n', r"setting tier_max_items .* not a list of numbers"),
        (
            {},
            "tier_max_items = [2000, 500, [200], 100]\n",
            r"setting tier_max_items .* not a list of numbers",
        ),
        (
            {},
            'tier_max_items = [2000, 500, "200", 100]\n',
            r"setting tier_max_items .* not a list of numbers",
        ),
        ({}, "data_dir = 5\n", r"setting data_dir .* not a valid"),  # (a directory named 5 before)
        ({}, 'data_dir = ["a", "b"]\n', r"setting data_dir .* not a valid"),
        ({"TIERMEM_LOG_LEVEL": "verbose"}, None, r"log_level.*DEBUG"),
        ({"TIERMEM_EMBEDDER": "word2vec"}, None, r"embedder.*builtin"),
        ({"TIERMEM_PORT": "x"}, None, r"TIERMEM_PORT='x' is not a valid int"),
    ],
)
def test_unknown_names_and_bad_values_are_named(
    tmp_path: Path, env: dict[str, str], content: str | None, message: str
) -> None:
    f = None
    if content is not None:
        f = tmp_path / "tiermem.toml"
        f.write_text(content)
    with pytest.raises(ValueError, match=message):
        ServerConfig.from_env(env=env, config_file=f)


def test_the_embedders_key_variable_and_the_admin_token_are_not_settings() -> None:
    ServerConfig.from_env(env={"TIERMEM_EMBEDDER_API_KEY": "k", "TIERMEM_API_KEY": "t", "TIERMEM_CONFIG": ""})
    ServerConfig.from_env(env={"MY_KEY": "k", "TIERMEM_EMBEDDER_API_KEY_ENV": "MY_KEY"})


def test_a_tiermem_named_key_variable_is_let_through_wherever_it_is_chosen(tmp_path: Path) -> None:
    # The variable the settings name holds the key; it is not a setting, however it was chosen.
    env = {"TIERMEM_OPENAI_KEY": "k", "TIERMEM_EMBEDDER_API_KEY_ENV": "TIERMEM_OPENAI_KEY"}
    assert ServerConfig.from_env(env=env).embedder_api_key_env == "TIERMEM_OPENAI_KEY"
    f = tmp_path / "tiermem.toml"
    f.write_text('embedder_api_key_env = "TIERMEM_OPENAI_KEY"\n')
    assert ServerConfig.from_env(env={"TIERMEM_OPENAI_KEY": "k"}, config_file=f).embedder_api_key_env == (
        "TIERMEM_OPENAI_KEY"
    )
    by_override = ServerConfig.from_env(
        env={"TIERMEM_OPENAI_KEY": "k"}, embedder_api_key_env="TIERMEM_OPENAI_KEY"
    )
    assert by_override.embedder_api_key_env == "TIERMEM_OPENAI_KEY"
    # Only the one the settings name (and the default's): another is still refused ...
    with pytest.raises(ValueError, match="unknown setting TIERMEM_OTHER_KEY"):
        ServerConfig.from_env(env={**env, "TIERMEM_OTHER_KEY": "k", "TIERMEM_EMBEDDER_API_KEY": "k"})
    # ... and the environment's choice wins over the file's, as for every setting.
    chosen = ServerConfig.from_env(
        env={"TIERMEM_ENV_KEY": "k", "TIERMEM_EMBEDDER_API_KEY_ENV": "TIERMEM_ENV_KEY"}, config_file=f
    )
    assert chosen.embedder_api_key_env == "TIERMEM_ENV_KEY"
    with pytest.raises(ValueError, match="unknown setting TIERMEM_OPENAI_KEY"):
        ServerConfig.from_env(
            env={"TIERMEM_OPENAI_KEY": "k", "TIERMEM_EMBEDDER_API_KEY_ENV": "TIERMEM_ENV_KEY"}, config_file=f
        )


def _server(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tiermem.server", "--port", "0", "--data-dir", str(tmp_path / "data"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("TIERMEM_")}, **(env or {})},
    )


@pytest.mark.parametrize(
    "args,env,named",
    [
        ((), {"TIERMEM_EMBEDER": "openai"}, "TIERMEM_EMBEDER"),
        (("--log-level", "verbose"), {}, "log_level"),
        ((), {"TIERMEM_EMBEDDER": "word2vec"}, "embedder"),
        # (checked when the lifecycle policy was built, after the data was opened: exit 1 and a traceback)
        ((), {"TIERMEM_RETENTION": "bogus"}, "retention"),
        ((), {"TIERMEM_TIER_MAX_ITEMS": "1,2"}, "tier_max_items"),
        ((), {"TIERMEM_HALF_LIFE_HOURS": "1,24,nan,720"}, "half_life_hours"),
        ((), {"TIERMEM_DEFAULT_TIER": "7"}, "default_tier"),
        ((), {"TIERMEM_EMBEDDER": "openai"}, "embedder_url"),
        ((), {"TIERMEM_EMBEDDER": "sentence_transformers"}, "embedder_model"),
        ((), {"TIERMEM_EMBEDDING_SPACES": "minilm=384,ada"}, "embedding_spaces"),
        ((), {"TIERMEM_EMBEDDING_SPACES": "minilm=0"}, "embedding_spaces"),
        ((), {"TIERMEM_EMBEDDING_SPACES": "minilm=\u00b2"}, "embedding_spaces"),
        ((), {"TIERMEM_EMBEDDING_SPACES": "minilm=384,minilm=768"}, "embedding_spaces"),
        ((), {"TIERMEM_EMBEDDING_SPACES": "tiermem-hash-v1=8"}, "embedding_spaces"),
    ],
)
def test_the_server_refuses_bad_settings_in_one_line(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], named: str
) -> None:
    proc = _server(tmp_path, *args, env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert named in err and "Traceback" not in err
    assert not (tmp_path / "data").exists()  # stopped before it opened any data


@pytest.mark.parametrize(
    "values,named",
    [
        ({"port": 70000}, "port"),
        ({"metrics_port": -2}, "metrics_port"),
        ({"max_message_bytes": 0}, "max_message_bytes"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"default_page_size": 2000}, "default_page_size"),
        ({"map_size": 0}, "map_size"),
        ({"max_map_size": -1}, "max_map_size"),
        ({"max_dimension": 0}, "max_dimension"),
        ({"builtin_dimension": 5000}, "builtin_dimension"),
        ({"max_keyword_postings": -1}, "max_keyword_postings"),
        ({"reflection_threshold": float("nan")}, "reflection_threshold"),
        ({"shutdown_grace_seconds": -1.0}, "shutdown_grace_seconds"),
        ({"request_id_ttl_seconds": -1.0}, "request_id_ttl_seconds"),
        ({"embedder_timeout_seconds": 0.0}, "embedder_timeout_seconds"),
        ({"surprise_alpha": 1.5}, "surprise_alpha"),
        ({"promote_access_count": 0}, "promote_access_count"),
        ({"promote_surprise": 2.0}, "promote_surprise"),
        ({"default_kind": " "}, "default_kind"),
        ({"tier_max_items": (9, 2000, 500, 200, 100)}, "tier_max_items"),
    ],
)
def test_limits_and_counts_out_of_range_are_refused_naming_the_setting(
    values: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=rf"^setting {named}="):
        ServerConfig(**values)  # type: ignore[arg-type]


def test_json_logs_carry_request_ids_and_an_access_line(tmp_path: Path) -> None:
    proc = _server(tmp_path, "--log-format", "json", "--log-level", "DEBUG")
    try:
        assert proc.stdout is not None and proc.stderr is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
        reader.start()
        port = None
        for line in proc.stdout:
            m = re.search(r"listening on [^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.MemoryServiceStub(ch)
            grpc.channel_ready_future(ch).result(timeout=60)
            stub.CreateMemory(
                pb.CreateMemoryRequest(memory=pb.Memory(namespace="logs", content="hello")),
                metadata=[("x-request-id", "req-42")],
                timeout=60,
            )
            with pytest.raises(grpc.RpcError):
                stub.GetMemory(pb.GetMemoryRequest(namespace="logs", id="missing"), timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        reader.join(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    records = [json.loads(line) for line in lines if line.strip()]  # every line is one JSON object
    settings = [r for r in records if r["message"].startswith("settings: ")]
    assert (
        settings and "embedder builtin" in settings[0]["message"] and "no API keys" in settings[0]["message"]
    )
    access = [r for r in records if r["logger"] == "tiermem.access"]
    create = [r for r in access if r["method"].endswith("/CreateMemory")]
    assert create and create[0]["code"] == "OK" and create[0]["request_id"] == "req-42"
    missing = [r for r in access if r["method"].endswith("/GetMemory")]
    assert missing and missing[0]["code"] == "NOT_FOUND" and missing[0]["request_id"]


def test_json_logs_of_refused_calls_and_of_search_followers(tmp_path: Path) -> None:
    """Under ``--log-format json`` every line is one JSON object, search followers' too (theirs
    name the process), and a call refused before its handler (an unknown key) carries the
    caller's request id in its access line as an answered call's does."""
    from tiermem.server.security.keys import add_key

    token = add_key(tmp_path / "keys.jsonl", [""], "admin")
    proc = _server(
        tmp_path,
        "--log-format", "json", "--log-level", "DEBUG", "--search-processes", "2",
        "--api-keys", str(tmp_path / "keys.jsonl"),
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
        reader.start()
        port = next(
            int(m.group(1)) for line in proc.stdout if (m := re.search(r"listening on [^:]+:(\d+)", line))
        )
        for i in range(8):  # (connections of their own: the kernel spreads them over both processes)
            with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.channel_id", i)]) as ch:
                stub = pb_grpc.MemoryServiceStub(ch)
                stub.SearchMemories(
                    pb.SearchMemoriesRequest(namespaces=["logs"], query_text="hello"),
                    metadata=[("authorization", f"Bearer {token}"), ("x-request-id", f"s-{i}")],
                    timeout=60,
                )
                if i == 0:
                    with pytest.raises(grpc.RpcError):
                        stub.GetStats(
                            pb.GetStatsRequest(),
                            metadata=[("authorization", "Bearer tm_nobody_x"), ("x-request-id", "refused-7")],
                            timeout=60,
                        )
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        reader.join(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    records = [json.loads(line) for line in lines if line.strip()]  # every line is one JSON object
    access = [r for r in records if r["logger"] == "tiermem.access"]
    refused = [r for r in access if r["method"].endswith("/GetStats")]
    assert refused and refused[0]["code"] == "UNAUTHENTICATED" and refused[0]["request_id"] == "refused-7"
    searches = [r for r in access if r["method"].endswith("/SearchMemories")]
    assert sorted(r["request_id"] for r in searches) == [f"s-{i}" for i in range(8)]
    assert any(r.get("process", "").startswith("follower ") for r in records), records


def test_per_tier_settings_take_the_four_tiers_alone() -> None:
    """FAST, MEDIUM, SLOW, GLACIAL, as the docs' table lists them; the internal form (index 0
    unused first) still works."""
    four = ServerConfig.from_env(env={"TIERMEM_HALF_LIFE_HOURS": "2,48,336,1440", "TIERMEM_CONFIG": ""})
    five = ServerConfig.from_env(env={"TIERMEM_HALF_LIFE_HOURS": "0,2,48,336,1440", "TIERMEM_CONFIG": ""})
    assert four.half_life_hours == five.half_life_hours == (0.0, 2.0, 48.0, 336.0, 1440.0)


def test_a_port_in_use_stops_the_server_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = _server(tmp_path, "--port", str(taken.getsockname()[1]))
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "cannot listen on 127.0.0.1" in err and "CANNOT_LISTEN" in err and "Traceback" not in err


@pytest.mark.parametrize("installed", [True, False])
def test_an_embedder_that_cannot_be_set_up_stops_the_server_in_one_line(
    tmp_path: Path, installed: bool
) -> None:
    """A sentence-transformers model directory that is missing, or the package not installed: exit
    status 2 and the reason in one line, as for any other setting, before LMDB is opened (it was a
    traceback, the data directory's LMDB created)."""
    model = tmp_path / ("missing" if installed else "model")
    if not installed:
        model.mkdir()
        blocker = tmp_path / "site" / "sentence_transformers"  # (a package that fails to import)
        blocker.mkdir(parents=True)
        (blocker / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {"TIERMEM_EMBEDDER": "sentence_transformers", "TIERMEM_EMBEDDER_MODEL": str(model)}
    if not installed:
        env["PYTHONPATH"] = str(tmp_path / "site")
    proc = _server(tmp_path, env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if "error:" in line]
    expected = "local model directory" if installed else "needs sentence-transformers"
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "data" / "lmdb" / "data.mdb").exists()  # (its folders only)


def test_a_declared_space_of_another_dimension_than_the_data_stops_the_server(tmp_path: Path) -> None:
    from tiermem.client import MemoryClient
    from tiermem.server.transport.app import create_server

    running = create_server(
        ServerConfig(port=0, data_dir=tmp_path / "data", maintenance_interval_seconds=0, search_processes=1)
    )
    with MemoryClient(f"127.0.0.1:{running.port}") as c:
        c.create("ns", "eight", embedding=[1.0] + [0.0] * 7, embedding_model="m8")
    running.stop(None)
    proc = _server(tmp_path, env={"TIERMEM_EMBEDDING_SPACES": "m8=4"})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "m8=4" in err and "EMBEDDING_SPACE_CONFLICT" in err and "Traceback" not in err
    running = create_server(  # declared as stored: it serves
        ServerConfig(
            port=0,
            data_dir=tmp_path / "data",
            maintenance_interval_seconds=0,
            embedding_spaces="m8=8",
            search_processes=1,
        )
    )
    try:
        with MemoryClient(f"127.0.0.1:{running.port}") as c:
            assert [s.dimension for s in c.stats().spaces if s.embedding_model == "m8"] == [8]
    finally:
        running.stop(None)


def test_every_setting_and_threshold_is_in_the_configuration_doc_with_its_default() -> None:
    """docs/configuration.md lists every ServerConfig setting and every Tuning threshold (a row
    whose first cell names it), each threshold with its default: a field added or changed
    without its row fails here."""
    import dataclasses

    from tiermem.server.config import Tuning

    doc = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text()
    rows: dict[str, str] = {}
    for first, second in re.findall(r"^\| ([^|]+) \|([^|]*)\|", doc, re.M):
        for name in re.findall(r"`([a-z_0-9]+)`", first):
            rows[name] = second.strip()
    settings = [f.name for f in dataclasses.fields(ServerConfig) if f.name != "tuning"]
    assert [name for name in settings if name not in rows] == []
    tuning = Tuning()
    for f in dataclasses.fields(Tuning):
        assert f.name in rows, f"Tuning.{f.name} has no row"
        documented = re.match(r"-?[\d.]+", rows[f.name].replace(",", ""))
        assert documented is not None, (f.name, rows[f.name])
        assert float(documented.group()) == float(getattr(tuning, f.name)), (f.name, rows[f.name])


@pytest.mark.parametrize(
    "line",
    ['{"id": "abc", "token": "tm_abc_x"}', "not json at all", '{"id": "a", "sha256": "00", "role": "admin"}'],
)
def test_a_malformed_keys_file_stops_the_start_in_one_line_with_status_2(tmp_path: Path, line: str) -> None:
    """A keys file the server cannot use is a setting's fault, as a missing one is: one line naming
    the file and its line, exit status 2, which the systemd unit does not restart after (it was a
    traceback and exit status 1: restarted every 5 s, forever)."""
    keys = tmp_path / "keys.jsonl"
    keys.write_text(line + "\n")
    proc = _server(tmp_path, "--api-keys", str(keys))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert "Traceback" not in err and len(errors) == 1 and f"{keys}:1" in errors[0], err
    assert not (tmp_path / "data" / "lmdb" / "data.mdb").exists()  # (refused before the data opened)
