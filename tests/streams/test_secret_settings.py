"""Secret settings: SecretStr, *_FILE, the DSN's password, the development key."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from projections.sealing.crypto import DEFAULT_MASTER_KEY_ID, MasterKeys, parse_master_keys
from streams.settings import (
    DEVELOPMENT_MASTER_KEY,
    DevelopmentKeyRefused,
    Settings,
    split_dsn_password,
)

REPO = Path(__file__).resolve().parents[2]
KEY_A = base64.b64encode(b"a" * 32).decode()
KEY_B = base64.b64encode(b"b" * 32).decode()
PASSWORD = "s3cr3t-pä ss@word"
SECRET_NAMES = (
    "MEMPROJ_MASTER_KEY",
    "MEMPROJ_MASTER_KEY_FILE",
    "MEMPROJ_MASTER_KEYS",
    "MEMPROJ_MASTER_KEYS_FILE",
    "MEMPROJ_POSTGRES_PASSWORD",
    "MEMPROJ_POSTGRES_PASSWORD_FILE",
    "MEMPROJ_POSTGRES_DSN",
    "MEMPROJ_ENVIRONMENT",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECRET_NAMES:
        monkeypatch.delenv(name, raising=False)


def secret_file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_master_key_is_read_from_its_file_without_one_trailing_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMPROJ_MASTER_KEY_FILE", str(secret_file(tmp_path, "key", KEY_A + "\n")))
    settings = Settings()
    assert settings.master_key.get_secret_value() == KEY_A
    assert settings.master_key_file is None  # the value is the setting, whatever its source
    assert settings.master_keyring == MasterKeys.single(b"a" * 32)


def test_only_one_trailing_newline_is_stripped(tmp_path: Path) -> None:
    path = secret_file(tmp_path, "password", "pw\n\n")
    settings = Settings(postgres_password_file=path)
    assert settings.postgres_password == SecretStr("pw\n")


def test_a_missing_secret_file_is_a_startup_error_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"MEMPROJ_MASTER_KEY_FILE=.*cannot read it"):
        Settings(master_key_file=tmp_path / "absent")
    with pytest.raises(ValidationError, match="MEMPROJ_POSTGRES_PASSWORD_FILE"):
        Settings(postgres_password_file=tmp_path / "absent")


def test_a_secret_and_its_file_together_are_refused(tmp_path: Path) -> None:
    path = secret_file(tmp_path, "key", KEY_A)
    with pytest.raises(ValidationError, match="not both"):
        Settings(master_key=KEY_B, master_key_file=path)
    with pytest.raises(ValidationError, match="MEMPROJ_MASTER_KEY or MEMPROJ_MASTER_KEYS"):
        Settings(master_key=KEY_A, master_keys=f"k2:{KEY_B}")


def test_the_dsn_password_moves_to_its_secret() -> None:
    settings = Settings(
        postgres_dsn="postgresql://memproj:s3cr%40t@db.example:5432/memproj?sslmode=require"
    )
    assert settings.postgres_dsn == "postgresql://memproj@db.example:5432/memproj?sslmode=require"
    assert settings.postgres_password == SecretStr("s3cr@t")
    assert "password=s3cr@t" in settings.postgres_conninfo.replace("'", "")
    with pytest.raises(ValidationError, match="give it once"):
        Settings(postgres_dsn="postgresql://u:p@h/db", postgres_password="q")


def test_split_dsn_password_forms() -> None:
    assert split_dsn_password("postgresql://u@h:1/db") == ("postgresql://u@h:1/db", None)
    assert split_dsn_password("postgresql://h/db") == ("postgresql://h/db", None)
    dsn, password = split_dsn_password("host=h user=u password='a b' dbname=db")
    assert password == "a b" and "password" not in dsn and "host=h" in dsn


def test_secrets_never_appear_in_repr_str_or_json(tmp_path: Path) -> None:
    dsn = f"postgresql://memproj:{PASSWORD.replace('@', '%40').replace(' ', '%20')}@h/db"
    for settings in (
        Settings(postgres_dsn=dsn, master_key=KEY_A),
        Settings(postgres_password=PASSWORD, master_keys=f"k2:{KEY_B},default:{KEY_A}"),
    ):
        assert settings.postgres_password == SecretStr(PASSWORD)
        shown = [
            repr(settings),
            str(settings),
            settings.model_dump_json(),
            repr(settings.master_keyring),
        ]
        for text in shown:
            assert PASSWORD not in text and KEY_A not in text and KEY_B not in text


def test_a_malformed_key_is_refused_without_showing_it() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(master_key="not-a-key-" + KEY_A[:20])
    assert "MEMPROJ_MASTER_KEY must be base64" in str(refused.value)
    assert KEY_A[:20] not in str(refused.value)
    with pytest.raises(ValidationError) as refused:
        Settings(master_keys=f"k2:{KEY_B[:30]}")
    assert "MEMPROJ_MASTER_KEYS key 'k2'" in str(refused.value)
    assert KEY_B[:30] not in str(refused.value)


def test_the_key_list_is_newest_first_with_ids() -> None:
    ring = parse_master_keys(f"k2:{KEY_B}\ndefault:{KEY_A}\n")
    assert ring.ids == ["k2", DEFAULT_MASTER_KEY_ID] and ring.newest_id == "k2"
    assert ring.key("default") == b"a" * 32
    for bad in (f"k2:{KEY_B},k2:{KEY_A}", KEY_A, f"bad id:{KEY_A}", ""):
        with pytest.raises(ValueError):
            parse_master_keys(bad)


def test_the_development_key_only_in_local_development() -> None:
    with pytest.raises(DevelopmentKeyRefused, match="published development key"):
        Settings().worker_master_keys()  # the default: production, and no key set
    with pytest.raises(DevelopmentKeyRefused):
        Settings(master_keys=f"k2:{KEY_B},default:{DEVELOPMENT_MASTER_KEY}").worker_master_keys()
    assert Settings(environment="local").worker_master_keys().ids == ["default"]
    assert Settings(master_key=KEY_A).worker_master_keys().ids == ["default"]
    with pytest.raises(ValidationError):
        Settings(environment="staging")


def test_a_worker_refuses_the_development_key_at_start() -> None:
    environment = {k: v for k, v in os.environ.items() if k not in SECRET_NAMES}
    started = subprocess.run(
        [sys.executable, "-m", "streams", "worker", "memory"],
        env={**environment, "MEMPROJ_ENVIRONMENT": "production"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert "published development key" in started.stderr
    assert "Traceback" not in started.stderr


def test_a_missing_secret_file_stops_a_command_clearly(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if k not in SECRET_NAMES}
    started = subprocess.run(
        [sys.executable, "-m", "streams", "keys", "status"],
        env={**environment, "MEMPROJ_MASTER_KEY_FILE": str(tmp_path / "absent")},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert "MEMPROJ_MASTER_KEY_FILE" in started.stderr and "cannot read it" in started.stderr
    assert "Traceback" not in started.stderr
