"""Settings classes (pydantic, ``offgraph.config``): every bad value is refused when the settings are
built, with one line naming the class, the field and its flag; the command lines' defaults are the
classes' defaults."""

from __future__ import annotations

import re

import pytest

from offgraph.cli import build_parser, main
from offgraph.model.train_config import TrainConfig
from offgraph.server.config import ServerConfig
from offgraph.store.config import StoreConfig
from offgraph.streaming.stream_train_config import StreamTrainConfig


@pytest.mark.parametrize(
    "kw, words",
    [
        # a string is not a flag: "no" used to switch the check ON
        ({"verify": "no"}, "ServerConfig.verify must be a valid boolean, got 'no'"),
        ({"tune_gc": 0}, "ServerConfig.tune_gc must be a valid boolean, got 0"),
        # a non-string token used to crash on .strip() (AttributeError, not a clear error)
        ({"admin_token": 123}, "ServerConfig.admin_token (--admin-token) must be a valid string, got 123"),
        ({"score_threads": True}, "ServerConfig.score_threads (--score-threads) must be a valid integer, got True"),
        ({"score_threads": 0}, "ServerConfig.score_threads (--score-threads) must be greater than or equal to 1"),
        ({"worker_id": -1}, "ServerConfig.worker_id must be greater than or equal to 0, got -1"),
        ({"cache_mb": float("inf")}, "ServerConfig.cache_mb (--cache-mb) must be a finite number"),
        ({"memory_mb": 0}, "ServerConfig.memory_mb (--memory-mb) must be greater than 0"),
        ({"memory_mb": float("nan")}, "ServerConfig.memory_mb (--memory-mb) must be a finite number"),
        ({"score_thread": 2}, "ServerConfig: unknown setting 'score_thread'"),  # used to be a TypeError
    ],
)
def test_server_config_refuses_naming_the_field(tmp_path, kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        ServerConfig(models_dir=tmp_path, **kw)


def test_server_config_refuses_a_missing_models_dir(tmp_path):
    with pytest.raises(
        ValueError, match=re.escape(f"ServerConfig.models_dir (--models): {tmp_path / 'x'}: not a directory")
    ):
        ServerConfig(models_dir=str(tmp_path / "x"))


def test_server_config_is_frozen_and_replace_validates(tmp_path):
    c = ServerConfig(models_dir=str(tmp_path), admin_token="  ")
    assert c.models_dir == tmp_path and c.admin_token is None  # a blank token disables admin
    with pytest.raises(ValueError, match="ServerConfig is frozen"):
        c.score_threads = 8
    assert c.replace(score_threads=8).score_threads == 8 and c.score_threads == 2
    with pytest.raises(ValueError, match="several workers need a control_dir"):
        c.replace(workers=2)
    with pytest.raises(ValueError, match=re.escape("worker_id must be < workers, got workers=2, worker_id=2")):
        c.replace(workers=2, worker_id=2, control_dir=tmp_path)


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"read_threads": True}, "StoreConfig.read_threads must be a valid integer, got True"),
        ({"compression_level": 4.0}, "StoreConfig.compression_level must be a valid integer, got 4.0"),
        ({"bottommost_compression": "gzip"}, "StoreConfig.bottommost_compression must be 'none', 'lz4'"),
        ({"backend": ""}, "StoreConfig.backend must have at least 1 character"),
        (
            {"quant": "int4", "shards": 0},
            "StoreConfig.quant must be 'fp32', 'fp16' or 'int8', got 'int4'; "
            "StoreConfig.shards must be greater than or equal to 1, got 0",
        ),
    ],
)
def test_store_config_refuses_naming_the_field(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        StoreConfig(dim=8, **kw)


def test_store_config_from_record_keeps_the_settings_only():
    record = {**StoreConfig(dim=8, shards=3).to_dict(), "row_counts": {"user": 5}, "bytes_on_disk": 10}
    assert StoreConfig.from_record(record) == StoreConfig(dim=8, shards=3)
    with pytest.raises(ValueError, match="StoreConfig: unknown setting 'row_counts'"):
        StoreConfig.from_dict(record)
    with pytest.raises(ValueError, match="StoreConfig: missing setting 'dim'"):
        StoreConfig.from_dict({"shards": 2})


@pytest.mark.parametrize(
    "kw, words",
    [
        # a fractional epoch count or a string lr used to pass and crash in the trainer (TypeError)
        ({"epochs": 2.5}, "TrainConfig.epochs (--epochs) must be a valid integer, got 2.5"),
        ({"lr": "0.1"}, "TrainConfig.lr (--lr) must be a valid number, got '0.1'"),
        ({"held_out": 1.0}, "TrainConfig.held_out (--held-out) must be less than 1, got 1.0"),
        ({"seed": -1}, "TrainConfig.seed (--seed) must be greater than or equal to 0, got -1"),
        ({"schedule": "linear"}, "TrainConfig.schedule must be 'constant' or 'cosine', got 'linear'"),
        # an unknown split used to pass here and fail only once the data was read and encoded
        (
            {"split": "daily"},
            "TrainConfig.split (--split): unknown split 'daily': expected one of ['per-key-time', 'random', 'time']",
        ),
    ],
)
def test_train_config_refuses_naming_the_field(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        TrainConfig(**kw)
    cfg = TrainConfig()
    with pytest.raises(ValueError, match=re.escape(words)):
        setattr(cfg, *next(iter(kw.items())))  # checked when set, too
    assert cfg == TrainConfig()


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"batch_size": 2.5}, "StreamTrainConfig.batch_size (--batch-size) must be a valid integer, got 2.5"),
        ({"every_events": True}, "StreamTrainConfig.every_events (--every-events) must be a valid integer, got True"),
        ({"lr": float("nan")}, "StreamTrainConfig.lr (--lr) must be a finite number"),
        (
            {"optimizer": "adagrad", "adagrad_init": 0, "adagrad_eps": 0},
            "StreamTrainConfig: adagrad needs adagrad_init > 0 or adagrad_eps > 0",
        ),
    ],
)
def test_stream_train_config_refuses_naming_the_field(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        StreamTrainConfig(**kw)


@pytest.mark.parametrize(
    "kw, words",
    [
        # a bad durability used to be accepted here and fail every store write (files dead-lettered)
        ({"durability": "fsync"}, "UpdaterConfig.durability (--durability) must be 'flush' or 'wal', got 'fsync'"),
        ({"sync": "no"}, "UpdaterConfig.sync (--sync) must be a valid boolean, got 'no'"),
        # a negative poll interval used to make the idle loop spin (Event.wait returns at once)
        ({"poll_interval_s": -1}, "UpdaterConfig.poll_interval_s (--poll-interval) must be greater than 0, got -1"),
        ({"version_check_s": "1"}, "UpdaterConfig.version_check_s must be a valid number, got '1'"),
        ({"batch_file": 8}, "UpdaterConfig: unknown setting 'batch_file'"),
    ],
)
def test_updater_refuses_bad_settings_naming_them(tmp_path, kw, words):
    from offgraph.streaming.sources import open_source
    from offgraph.streaming.updater import Updater

    with pytest.raises(ValueError, match=re.escape(words)):
        Updater(tmp_path / "models", "ml", open_source(f"spool:{tmp_path / 'spool'}"), **kw)


def test_durability_names_agree_with_the_store():
    from offgraph.store.base import DURABILITY as STORE_DURABILITY
    from offgraph.streaming.updater_config import DURABILITY

    assert sorted(DURABILITY) == sorted(STORE_DURABILITY)


def _parsed_defaults(*argv: str):
    return vars(build_parser().parse_args(list(argv)))


# flag -> (settings class, field): what each command line passes to its settings
SERVE = {
    "memory_mb": "memory_mb",
    "cache_mb": "cache_mb",
    "max_candidates": "max_candidates",
    "max_request_values": "max_request_values",
    "poll_seconds": "poll_seconds",
    "score_threads": "score_threads",
    "follow_seconds": "follow_interval_s",
    "catch_up_seconds": "catch_up_s",
    "workers": "workers",
}
HTTP = {
    "header_timeout": "header_timeout_s",
    "body_timeout": "body_timeout_s",
    "keep_alive_timeout": "keep_alive_timeout_s",
    "max_connections": "max_connections",
}
STREAM = {
    "lr": "lr",
    "optimizer": "optimizer",
    "batch_size": "batch_size",
    "l2": "l2",
    "adagrad_init": "adagrad_init",
    "every_events": "every_events",
    "every_seconds": "every_seconds",
    "seq_start": "seq_start",
    "time_unit": "time_unit",
    "lr_first_order": "lr_first_order",
}
UPDATE = {
    "batch_files": "batch_files",
    "max_batch_rows": "max_batch_rows",
    "max_batch_delay": "max_batch_delay_s",
    "wait_timeout": "wait_timeout_s",
    "poll_interval": "poll_interval_s",
    "durability": "durability",
    "max_deltas_per_s": "max_deltas_per_s",
}
TRAIN = {
    "epochs": "epochs",
    "batch_size": "batch_size",
    "lr": "lr",
    "optimizer": "optimizer",
    "loss": "loss",
    "split": "split",
    "held_out": "held_out",
    "seed": "seed",
}


def test_command_line_defaults_are_the_settings_defaults(tmp_path):
    from offgraph.server.config import HttpLimits
    from offgraph.streaming.updater_config import UpdaterConfig

    serve = _parsed_defaults("serve", "--models", str(tmp_path))
    lib = ServerConfig(models_dir=tmp_path)
    assert lib.score_threads == serve["score_threads"] == 2  # the measured better one (offgraph/server/README.md)
    assert {f: serve[a] for a, f in SERVE.items()} == {f: getattr(lib, f) for f in SERVE.values()}
    assert int(serve["max_body_mb"] * 2**20) == lib.max_body_bytes
    assert {f: serve[a] for a, f in HTTP.items()} == HttpLimits().model_dump()

    stream = _parsed_defaults("stream-train", "--model", "m", "--events", "e", "--emit", "spool:s")
    lib = StreamTrainConfig()
    assert (lib.lr, lib.batch_size) == (stream["lr"], stream["batch_size"]) == (0.003, 32)
    assert {f: stream[a] for a, f in STREAM.items()} == {f: getattr(lib, f) for f in STREAM.values()}

    update = _parsed_defaults("update", "--models", "m", "--model", "ml", "--source", "spool:s")
    lib = UpdaterConfig()
    assert {f: update[a] for a, f in UPDATE.items()} == {f: getattr(lib, f) for f in UPDATE.values()}
    assert update["sync"] is lib.sync is False

    train = _parsed_defaults("train", "--spec", "s", "--data", "d", "--out", "o")
    assert {f: train[a] for a, f in TRAIN.items()} == TrainConfig().model_dump(include=set(TRAIN.values()))


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["serve", "--score-threads", "0"],
            "offgraph serve: error: ServerConfig.score_threads (--score-threads) must be greater than or equal to 1, got 0",
        ),
        (
            ["serve", "--header-timeout", "nan"],
            "offgraph serve: error: HttpLimits.header_timeout_s (--header-timeout) must be a finite number, got nan",
        ),
        (
            ["update", "--model", "ml", "--source", "spool:s", "--poll-interval", "0"],
            "offgraph update: error: UpdaterConfig.poll_interval_s (--poll-interval) must be greater than 0, got 0.0",
        ),
        (
            ["train", "--spec", "s", "--data", "d", "--out", "o", "--held-out", "0"],
            "offgraph train: error: TrainConfig.held_out (--held-out) must be greater than 0, got 0.0",
        ),
    ],
)
def test_command_line_reports_a_bad_setting_in_one_line(tmp_path, capsys, argv, words):
    argv = [*argv[:1], "--models", str(tmp_path), *argv[1:]] if argv[0] in ("serve", "update") else argv
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == words, err
