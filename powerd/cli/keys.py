"""``powerd keys``: the controller role's signing keys (powerd.signing does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from powerd.signing import KeyFileError, generate_key_files, load_signer, load_trusted_key


@click.group(
    "keys", short_help="Make a signing key pair (controllers sign, agents trust the .pub)."
)
def group() -> None:
    """Signing keys of the controller role.

    Controllers sign every command and heartbeat with the private key
    (controller trust.signing_key); agents obey only what a public key they
    trust signed (agent trust.controller_keys). docs/PROTOCOL.md, "Signed
    messages", says how to rotate a key.

    \b
    Examples:
      powerd keys generate /etc/powerd/controller    # controller.key and controller.pub
      powerd keys id /etc/powerd/controller.pub
    """


@group.command("generate", short_help="Write a new key pair: PREFIX.key (private) and PREFIX.pub.")
@click.argument("prefix", type=click.Path(dir_okay=False, path_type=Path))
def generate(prefix: Path) -> None:
    """Write a new Ed25519 key pair: PREFIX.key (private, mode 0600) and PREFIX.pub.

    Never overwrites an existing file. Copy PREFIX.key to the controllers only
    (leader and standby) and PREFIX.pub to every agent.

    \b
    Examples:
      powerd keys generate /etc/powerd/controller
      powerd keys id /etc/powerd/controller.pub
    """
    try:
        key_path, pub_path = generate_key_files(prefix)
        key_id = load_trusted_key(pub_path).key_id
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{key_path}  private: controllers only (trust.signing_key)")
    click.echo(f"{pub_path}  public: every agent (trust.controller_keys); key id {key_id}")


@group.command("id", short_help="Print the key id of a public or private key file.")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def key_id(path: Path) -> None:
    """Print the key id of a public or private key file (the `key` of signed messages).

    \b
    Examples:
      powerd keys id /etc/powerd/controller.pub      # the id agents log for a trusted key
      powerd keys id /etc/powerd/controller.key      # the same id, from the private key
    """
    try:
        private = path.exists() and b"PRIVATE KEY" in path.read_bytes()
        found = load_signer(path).key_id if private else load_trusted_key(path).key_id
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(found)
