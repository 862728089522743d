"""``powerd keys``: signing key pairs of each role (powerd.signing does the work)."""

from __future__ import annotations

from pathlib import Path

import click

from powerd.signing import KeyFileError, generate_key_files, key_id_of_file, load_trusted_key

# Where each role's key files go: (its private key, its public key). The config keys are
# those of the agent's, controller's and coordinator's configs (powerd/data/*.example.toml).
ROLE_PLACES: dict[str, tuple[str, str]] = {
    "controller": (
        "the controllers only, leader and standby (trust.signing_key)",
        "every agent (trust.controller_keys); in a tree of controllers, the coordinators "
        "too (trust.controller_keys, --trust)",
    ),
    "coordinator": (
        "the coordinators only, leader and standby (trust.signing_key)",
        "every leaf controller (trust.coordinator_keys, --coordinator-key)",
    ),
    "operator": (
        "the operator only (powerd limit --key)",
        "the site's controllers, or in a tree the coordinators (trust.operator_keys)",
    ),
}


def role_of(prefix: Path, given: str | None) -> tuple[str, str]:
    """The role (``given``, else the one ``prefix``'s name starts with, else controller) and
    how it was chosen, for the output."""
    if given is not None:
        return given, "--role"
    name = prefix.name.lower()
    named = next((role for role in ROLE_PLACES if name.startswith(role)), None)
    if named is not None:
        return named, "from the name; --role to choose"
    return "controller", "the default; --role to choose"


@click.group("keys", short_help="Make a signing key pair (one role signs, others trust the .pub).")
def group() -> None:
    """Signing keys of the controller, coordinator and operator roles.

    Controllers sign every command and heartbeat with the private key
    (controller trust.signing_key); agents obey only what a public key they
    trust signed (agent trust.controller_keys). A coordinator signs grants
    (leaves trust its .pub: trust.coordinator_keys), an operator site limits
    (controllers trust its .pub: trust.operator_keys). Each role has its own
    pair: one public key trusted in two roles is refused. docs/PROTOCOL.md,
    "Signed messages", says how to rotate a key.

    \b
    Examples:
      powerd keys generate /etc/powerd/controller    # controller.key and controller.pub
      powerd keys generate /etc/powerd/site-desk --role operator
      powerd keys id /etc/powerd/controller.pub
    """


@group.command("generate", short_help="Write a new key pair: PREFIX.key (private) and PREFIX.pub.")
@click.argument("prefix", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--role",
    type=click.Choice(sorted(ROLE_PLACES)),
    default=None,
    help="Whose key: where the files go. Default: the role PREFIX's name starts with "
    "(controller, coordinator, operator), else controller.",
)
def generate(prefix: Path, role: str | None) -> None:
    """Write a new Ed25519 key pair: PREFIX.key (private, mode 0600) and PREFIX.pub.

    Never overwrites an existing file. Prints where each file goes for the
    role: a controller's PREFIX.key to the controllers only (leader and
    standby), its PREFIX.pub to every agent; a coordinator's .pub to the leaf
    controllers; an operator's .pub to the controllers (or coordinators).

    \b
    Examples:
      powerd keys generate /etc/powerd/controller
      powerd keys generate /etc/powerd/coordinator
      powerd keys generate /etc/powerd/operator
      powerd keys id /etc/powerd/controller.pub
    """
    chosen, why = role_of(prefix, role)
    try:
        key_path, pub_path = generate_key_files(prefix)
        key_id = load_trusted_key(pub_path).key_id
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    private_place, public_place = ROLE_PLACES[chosen]
    click.echo(f"role: {chosen} ({why})")
    click.echo(f"{key_path}  private: {private_place}")
    click.echo(f"{pub_path}  public: {public_place}; key id {key_id}")


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
        found = key_id_of_file(path)
    except KeyFileError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(found)
