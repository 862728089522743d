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


# --- key hygiene (issue 34) -------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_trusted_key_others_may_write_is_refused_saying_how_to_fix_it(
    tmp_path: Path, mode: int
) -> None:
    """Whoever may write a trusted .pub may put their own key in it."""
    _, pub_path = generate_key_files(tmp_path / "ctl")
    os.chmod(pub_path, mode)
    with pytest.raises(KeyFileError) as refused:
        load_trusted_key(pub_path)
    message = str(refused.value)
    assert str(pub_path) in message and f"mode {mode:04o}" in message
    assert f"chmod go-w {pub_path}" in message
    with pytest.raises(KeyFileError, match="chmod go-w"):
        load_verifier([pub_path])
    os.chmod(pub_path, 0o644)
    assert load_trusted_key(pub_path).key_id  # fixed as told, it loads


def test_generated_public_keys_are_not_writable_by_others_whatever_the_umask(
    tmp_path: Path,
) -> None:
    before = os.umask(0o002)
    try:
        _, pub_path = generate_key_files(tmp_path / "ctl")
    finally:
        os.umask(before)
    assert stat.S_IMODE(pub_path.stat().st_mode) == 0o644
    assert load_trusted_key(pub_path).key_id


def special_files(tmp_path: Path) -> dict[str, Path]:
    """Key paths that are no regular file: what each is called in the refusal."""
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)  # a plain read would wait for a writer for ever
    folder = tmp_path / "keys.d"
    folder.mkdir()
    return {
        "a character device": Path("/dev/zero"),
        "a pipe": fifo,
        "a directory": folder,
    }


@pytest.mark.parametrize("kind", ["a character device", "a pipe", "a directory"])
def test_a_key_path_that_is_no_regular_file_is_refused_without_reading_it(
    tmp_path: Path, kind: str
) -> None:
    """``--trust /dev/zero`` read without bound; a FIFO would block the load."""
    path = special_files(tmp_path)[kind]
    for load in (load_trusted_key, load_signer):
        with pytest.raises(KeyFileError) as refused:
            load(path)
        assert str(refused.value) == (
            f"{path}: not a regular file ({kind}); a key file is a PEM file"
        )


def test_a_huge_key_file_is_refused_after_a_bounded_read(tmp_path: Path) -> None:
    from powerd.signing import MAX_KEY_FILE_BYTES

    huge = tmp_path / "huge.pub"
    with huge.open("wb") as out:
        out.truncate(1 << 30)  # 1 GiB, sparse
    just_over = tmp_path / "over.pub"
    just_over.write_bytes(b"x" * (MAX_KEY_FILE_BYTES + 1))
    for path in (huge, just_over):
        with pytest.raises(KeyFileError, match=f"over {MAX_KEY_FILE_BYTES} bytes: not a key"):
            load_trusted_key(path)
    os.chmod(huge, 0o600)
    with pytest.raises(KeyFileError, match="not a key file"):
        load_signer(huge)


def test_a_public_key_given_as_a_private_key_is_called_a_public_key(tmp_path: Path) -> None:
    """Not blamed on its mode (0644, right for a .pub): chmod 600 would not have helped. The
    message names the private key beside it where there is one."""
    key_path, pub_path = generate_key_files(tmp_path / "ctl")
    with pytest.raises(KeyFileError) as refused:
        load_signer(pub_path)
    message = str(refused.value)
    assert message == f"{pub_path}: this is a public key; give the private key: {key_path}"
    assert "chmod" not in message and "mode" not in message


def test_an_openssh_public_key_given_as_a_private_key_is_called_a_public_key(
    tmp_path: Path,
) -> None:
    """ssh-keygen's id_ed25519.pub (one OpenSSH line, 0644) was blamed on its mode: 'chmod
    600' and then 'not an unencrypted PEM private key'. Before any mode check: a public
    key, and the file without .pub is named where it exists, a hint where it does not."""
    public = Signer.generate().public.public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    lone = tmp_path / "id_ed25519.pub"
    lone.write_bytes(public + b" me@host\n")
    lone.chmod(0o644)
    with pytest.raises(KeyFileError) as refused:
        load_signer(lone)
    message = str(refused.value)
    assert message.startswith(f"{lone}: this is a public key; give the private key (the file ")
    assert "without .pub" in message and "mode" not in message and "chmod" not in message
    private = tmp_path / "id_ed25519"
    private.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(
        KeyFileError, match=f"this is a public key; give the private key: {private}$"
    ):
        load_signer(lone)
    renamed = tmp_path / "operator.key"  # an OpenSSH line in a file not named .pub
    renamed.write_bytes(public + b"\n")
    renamed.chmod(0o600)
    with pytest.raises(KeyFileError, match="this is a public key; give the private key"):
        load_signer(renamed)


def test_one_key_in_two_roles_is_refused_naming_both_roles_and_files(tmp_path: Path) -> None:
    from powerd.signing import RoleKeys, check_roles

    key_path, pub_path = generate_key_files(tmp_path / "controller")
    _, op_pub = generate_key_files(tmp_path / "operator")
    own = RoleKeys("controller", "trust.signing_key", (load_signer(key_path).trusted(),))
    operators = RoleKeys("operator", "trust.operator_keys", (load_trusted_key(pub_path),))
    with pytest.raises(KeyFileError) as refused:
        check_roles([own, operators])
    message = str(refused.value)
    for part in (
        f"trust.signing_key ({key_path}, the controller role)",
        f"trust.operator_keys ({pub_path}, the operator role)",
        "two roles",
    ):
        assert part in message
    # one key in two entries of one role, and distinct keys in two roles, are fine
    peers = RoleKeys("controller", "trust.controller_keys", (load_trusted_key(pub_path),))
    check_roles(
        [own, peers, RoleKeys("operator", "trust.operator_keys", (load_trusted_key(op_pub),))]
    )


@pytest.mark.parametrize(
    ("args", "role", "public_goes_to", "not_to"),
    [
        ([], "controller", "every agent (trust.controller_keys)", "trust.operator_keys"),
        (["--role", "operator"], "operator", "(trust.operator_keys)", "trust.controller_keys"),
        (
            ["--role", "coordinator"],
            "coordinator",
            "every leaf controller (trust.coordinator_keys",
            "trust.operator_keys",
        ),
    ],
)
def test_powerd_keys_generate_says_where_each_roles_files_go(
    tmp_path: Path, args: list[str], role: str, public_goes_to: str, not_to: str
) -> None:
    from click.testing import CliRunner

    from powerd.cli import main

    prefix = tmp_path / "site-key"
    done = CliRunner().invoke(main, ["keys", "generate", str(prefix), *args])
    assert done.exit_code == 0, done.output
    public_line = next(line for line in done.output.splitlines() if "public:" in line)
    assert public_line.startswith(f"{prefix}.pub  public: ")
    assert public_goes_to in public_line and not_to not in public_line
    assert f"role: {role}" in done.output


@pytest.mark.parametrize(
    ("name", "public_goes_to"),
    [
        ("operator", "the site's controllers, or in a tree the coordinators (trust.operator_keys)"),
        ("coordinator", "every leaf controller (trust.coordinator_keys, --coordinator-key)"),
        ("controller", "every agent (trust.controller_keys)"),
    ],
)
def test_powerd_keys_generate_takes_the_role_from_the_prefix_name(
    tmp_path: Path, name: str, public_goes_to: str
) -> None:
    """`powerd keys generate operator` printed "every agent (trust.controller_keys)"."""
    from click.testing import CliRunner

    from powerd.cli import main

    done = CliRunner().invoke(main, ["keys", "generate", str(tmp_path / name)])
    assert done.exit_code == 0, done.output
    assert f"{tmp_path / name}.pub  public: {public_goes_to}" in done.output
    assert f"role: {name} (from the name" in done.output


def test_powerd_keys_id_refuses_a_device_without_reading_it() -> None:
    from click.testing import CliRunner

    from powerd.cli import main

    done = CliRunner().invoke(main, ["keys", "id", "/dev/zero"])
    assert done.exit_code == 1 and "not a regular file (a character device)" in done.output
