"""Signed commands and heartbeats (powerd.signing, docs/PROTOCOL.md "Signed commands and
heartbeats"): what verifies, what does not, and the key files."""

from __future__ import annotations

import os
import stat
from importlib import resources
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given
from hypothesis import strategies as st

from powerd.protocol import (
    Command,
    GpuCommand,
    Heartbeat,
    Topics,
    decode,
    detach_signature,
    encode,
)
from powerd.signing import (
    KeyFileError,
    SignatureError,
    Signer,
    Verifier,
    generate_key_files,
    load_signer,
    load_trusted_key,
    load_verifier,
)

TOPICS = Topics("c1")
SIGNER = Signer.generate()
VERIFIER = Verifier([SIGNER.trusted()])
COMMAND = encode(
    Command(v=1, epoch=7, seq=12, ts=1.0, ttl_s=30.0, gpus=[GpuCommand(index=0, cap_w=450.0)])
)
BEAT = encode(Heartbeat(v=1, epoch=7, ts=1.0, controller="ctl-a", state="leader"))


def test_a_signed_command_verifies_and_decodes_as_the_message_it_was() -> None:
    topic = TOPICS.command("n1")
    payload = SIGNER.sign(topic, COMMAND)
    assert VERIFIER.decode(Command, topic, payload) == decode(Command, COMMAND)
    # a reader that does not verify sees the same message plus two fields it ignores
    assert decode(Command, payload) == decode(Command, COMMAND)
    assert detach_signature(payload) is not None
    assert detach_signature(payload)[0] == COMMAND  # type: ignore[index]


def test_unsigned_messages_are_refused() -> None:
    with pytest.raises(SignatureError, match="not signed"):
        VERIFIER.open(TOPICS.command("n1"), COMMAND)
    with pytest.raises(SignatureError, match="not signed"):
        VERIFIER.open(TOPICS.heartbeat, b"\xff\x00garbage")


def test_a_signature_does_not_travel_to_another_topic() -> None:
    """A command signed for n1 is no command for n2, nor a heartbeat, nor for another cluster."""
    payload = SIGNER.sign(TOPICS.command("n1"), COMMAND)
    for topic in (TOPICS.command("n2"), TOPICS.heartbeat, Topics("c2").command("n1")):
        with pytest.raises(SignatureError, match="bad signature"):
            VERIFIER.open(topic, payload)


def test_a_key_nobody_trusts_is_refused_by_id() -> None:
    stranger = Signer.generate()
    with pytest.raises(SignatureError, match=f"key {stranger.key_id}"):
        VERIFIER.open(TOPICS.heartbeat, stranger.sign(TOPICS.heartbeat, BEAT))


def test_while_a_key_rotates_both_verify() -> None:
    new = Signer.generate()
    both = Verifier([SIGNER.trusted(), new.trusted()])
    for signer in (SIGNER, new):
        assert both.decode(Heartbeat, TOPICS.heartbeat, signer.sign(TOPICS.heartbeat, BEAT))


@given(st.data())
def test_any_changed_byte_breaks_the_signature(data: st.DataObject) -> None:
    topic = TOPICS.command("n1")
    payload = bytearray(SIGNER.sign(topic, COMMAND))
    at = data.draw(st.integers(0, len(payload) - 1))
    value = data.draw(st.integers(0, 255).filter(lambda b: b != payload[at]))
    payload[at] = value
    with pytest.raises(SignatureError):
        VERIFIER.open(topic, bytes(payload))


def test_a_signature_spelled_another_way_is_refused() -> None:
    """Found by the property test above: the last of the 86 base64 characters of a
    signature carries 4 unused bits, so 16 spellings decoded to the same signature and a
    payload with a changed byte verified."""
    topic = TOPICS.command("n1")
    payload = SIGNER.sign(topic, COMMAND)
    last = payload[-3:-2]  # the signature's last character, before '"}'
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    index = alphabet.index(last)
    twin = alphabet[index ^ 1 : (index ^ 1) + 1]  # same top 2 bits, another low bit
    forged = payload[:-3] + twin + payload[-2:]
    assert forged != payload
    with pytest.raises(SignatureError, match="bad signature"):
        VERIFIER.open(topic, forged)


def test_nothing_may_follow_the_signature() -> None:
    """The signature must close the object: a member added after it makes it unsigned."""
    payload = SIGNER.sign(TOPICS.heartbeat, BEAT)
    forged = payload[:-1] + b',"epoch":99}'
    with pytest.raises(SignatureError, match="not signed"):
        VERIFIER.open(TOPICS.heartbeat, forged)


# --- key files ----------------------------------------------------------------------


def test_generated_key_files_load_and_match(tmp_path: Path) -> None:
    key_path, pub_path = generate_key_files(tmp_path / "ctl")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    signer = load_signer(key_path)
    trusted = load_trusted_key(pub_path)
    assert signer.key_id == trusted.key_id
    verifier = load_verifier([pub_path])
    assert verifier.decode(Heartbeat, TOPICS.heartbeat, signer.sign(TOPICS.heartbeat, BEAT))


def test_generate_never_overwrites(tmp_path: Path) -> None:
    key_path, _ = generate_key_files(tmp_path / "ctl")
    before = key_path.read_bytes()
    with pytest.raises(KeyFileError, match="exists"):
        generate_key_files(tmp_path / "ctl")
    assert key_path.read_bytes() == before


def test_a_private_key_others_may_read_is_refused(tmp_path: Path) -> None:
    key_path, _ = generate_key_files(tmp_path / "ctl")
    os.chmod(key_path, 0o640)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_signer(key_path)


def test_a_private_key_given_as_a_trusted_key_is_refused(tmp_path: Path) -> None:
    key_path, _ = generate_key_files(tmp_path / "ctl")
    with pytest.raises(KeyFileError, match="private key; give agents the public key"):
        load_trusted_key(key_path)


def test_keys_of_another_kind_and_missing_files_are_refused_with_the_file(tmp_path: Path) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    ec_pub = tmp_path / "ec.pub"
    ec_pub.write_bytes(
        other.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    with pytest.raises(KeyFileError, match=r"ec\.pub: an Ed25519 key is needed"):
        load_trusted_key(ec_pub)
    with pytest.raises(KeyFileError, match=r"nope\.pub"):
        load_trusted_key(tmp_path / "nope.pub")
    (tmp_path / "junk.pub").write_text("hello")
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        load_trusted_key(tmp_path / "junk.pub")
    with pytest.raises(KeyFileError, match="no trusted controller key"):
        load_verifier([])


# --- the command line -------------------------------------------------------------------


def test_powerd_keys_generate_writes_a_pair_the_agent_and_controller_load(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from powerd.agent.config import load_config
    from powerd.cli import main
    from powerd.controller.config import load_controller_config

    runner = CliRunner()
    done = runner.invoke(main, ["keys", "generate", str(tmp_path / "ctl")])
    assert done.exit_code == 0, done.output
    key_id = load_trusted_key(tmp_path / "ctl.pub").key_id
    assert key_id in done.output
    again = runner.invoke(main, ["keys", "generate", str(tmp_path / "ctl")])
    assert again.exit_code == 1 and "not overwriting" in again.output
    shown = runner.invoke(main, ["keys", "id", str(tmp_path / "ctl.key")])
    assert shown.exit_code == 0 and shown.output.strip() == key_id
    # the files, named relative to the config files that name them
    (tmp_path / "agent.toml").write_text('[trust]\ncontroller_keys = ["ctl.pub"]\n')
    (tmp_path / "controller.toml").write_text('[trust]\nsigning_key = "ctl.key"\n')
    verifier = load_config(tmp_path / "agent.toml").verifier()
    signer = load_controller_config(tmp_path / "controller.toml").signer()
    assert verifier is not None and signer.key_id in verifier.keys


def test_an_agent_with_no_trusted_key_or_a_bad_one_stops_with_the_file_named(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from powerd.cli import main

    runner = CliRunner()
    none = runner.invoke(main, ["agent", "--simulate", "1xH100", "--node", "n1"])
    assert none.exit_code == 1
    assert "trust.controller_keys" in none.output and "powerd keys generate" in none.output
    junk = tmp_path / "junk.pub"
    junk.write_text("not a key")
    bad = runner.invoke(main, ["agent", "--simulate", "1xH100", "--trust", str(junk)])
    assert bad.exit_code == 1 and f"{junk}: not a PEM public key" in bad.output
    local = runner.invoke(main, ["agent", "--help"])
    assert "--trust" in local.output


def test_a_controller_with_no_signing_key_stops_saying_how_to_make_one(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from powerd.cli import main

    budgets = Path(str(resources.files("powerd.data").joinpath("budgets", "tiny.toml")))
    done = CliRunner().invoke(main, ["controller", "--budgets", str(budgets)])
    assert done.exit_code == 1
    assert "trust.signing_key" in done.output and "powerd keys generate" in done.output
