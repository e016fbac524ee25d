"""`parley staff create|list|role|password|disable|enable`: accounts for the staff console."""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from core.errors import InvalidInput
from core.store.staff import ROLES, StaffAccounts, check_password
from gateway.runtime import Runtime

PASSWORD_ENV = "PARLEY_STAFF_PASSWORD"  # noqa: S105 - the variable's name, not a password


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    staff = commands.add_parser("staff", help="staff accounts for the console at /admin")
    actions = staff.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create",
        aliases=["add"],
        help="create an account; the password is asked for (or read from standard input, "
        f"or {PASSWORD_ENV})",
    )
    create.add_argument("email", metavar="EMAIL")
    create.add_argument("--name", default="", help="name shown to colleagues")
    create.add_argument(
        "--role",
        choices=ROLES,
        default=None,
        help="admin: everything; agent: conversations, handoff, gaps, curated answers, answer "
        "checks and the playground (default: agent, or admin for the first account)",
    )
    actions.add_parser("list", help="list accounts")
    role = actions.add_parser(
        "role", help="give an account another role (the last admin stays an admin)"
    )
    role.add_argument("email", metavar="EMAIL")
    role.add_argument("role", choices=ROLES, metavar="ROLE", help=" or ".join(ROLES))
    password = actions.add_parser("password", help="set a new password for an account")
    password.add_argument("email", metavar="EMAIL")
    for action, text in (("disable", "stop an account signing in"), ("enable", "allow it again")):
        actions.add_parser(action, help=text).add_argument("email", metavar="EMAIL")


def read_password() -> str:
    """From the environment, else a prompt (typed twice), else the first line of stdin."""
    given = os.environ.get(PASSWORD_ENV)
    if given:
        return check_password(given)
    if sys.stdin.isatty():
        first = getpass.getpass("Password: ")
        check_password(first)
        if getpass.getpass("Password again: ") != first:
            raise InvalidInput("the passwords differ")
        return first
    line = sys.stdin.readline().rstrip("\r\n")
    if not line:
        raise InvalidInput(f"no password: type one, pipe it in, or set {PASSWORD_ENV}")
    return check_password(line)


async def run(args: argparse.Namespace, runtime: Runtime) -> None:
    accounts = StaffAccounts(runtime.database.pool)
    if args.action in ("create", "add"):
        member = await accounts.create(
            args.email, read_password(), display_name=args.name, role=args.role
        )
        print(f"created staff account {member.email} ({member.display_name}), role {member.role}")
    elif args.action == "role":
        member = await accounts.set_role(args.email, args.role)
        print(f"{member.email} is now {member.role}")
    elif args.action == "password":
        await accounts.set_password(args.email, read_password())
        print(f"password changed for {args.email.strip().lower()}")
    elif args.action in ("disable", "enable"):
        await accounts.set_disabled(args.email, args.action == "disable")
        print(f"{args.action}d staff account {args.email.strip().lower()}")
    else:
        for member in await accounts.list():
            seen = (
                member.last_sign_in_at.isoformat(timespec="seconds")
                if member.last_sign_in_at
                else "-"
            )
            state = "disabled" if member.disabled else "active"
            print(
                f"{member.email}\t{member.display_name}\t{state}\t{member.role}"
                f"\tlast sign-in {seen}"
            )
