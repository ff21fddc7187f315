"""`spotrain budget NAME`: a budget's limit, actual and forecast spend."""

from __future__ import annotations

import argparse
from typing import Any

from spotrain.cli.output import say
from spotrain.core.errors import aws_errors


def cmd_budget(args: argparse.Namespace) -> int:
    with aws_errors(
        f"budget {args.name!r}",
        "budgets are named spotrain-<env>-monthly (the budget stack's output); check your "
        "credentials",
    ):
        return _budget(args)


def _budget(args: argparse.Namespace) -> int:
    from spotrain.core import aws_clients

    account = aws_clients.client("sts").get_caller_identity()["Account"]
    budget = aws_clients.client("budgets").describe_budget(AccountId=account, BudgetName=args.name)[
        "Budget"
    ]
    limit = budget["BudgetLimit"]
    spend = budget.get("CalculatedSpend", {})
    actual = spend.get("ActualSpend", {}).get("Amount", "0")
    forecast = spend.get("ForecastedSpend", {}).get("Amount", "n/a")
    period = budget["TimeUnit"].lower()
    say(f"{args.name}: limit {float(limit['Amount']):,.2f} {limit['Unit']} per {period}; "
         f"actual {float(actual):,.2f}; forecast {forecast}")  # fmt: skip
    filters = budget.get("CostFilters", {})
    if filters:
        say(f"  counts costs tagged {filters}")
    return 0


def add_parsers(commands: Any) -> None:
    budget = commands.add_parser("budget", help="a budget's limit, actual and forecast spend")
    budget.add_argument("name", help="budget name, e.g. spotrain-prod-monthly")
    budget.set_defaults(handler=cmd_budget)
