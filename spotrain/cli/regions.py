"""Which of an environment's regions answer: the commands on-call runs during a region's
outage (`run status`, `run list`) answer from the regions that do."""

from __future__ import annotations


def region_answers(table: str, region: str) -> bool:
    """Whether `region` answers (asked about its copy of the events table, with short
    timeouts): any answer, a refusal or a missing table too, is the region's; a connection
    that fails or 5xx after a retry (`errors.does_not_answer`) is an outage."""
    import sys

    from spotrain.core import aws_clients
    from spotrain.core.errors import does_not_answer

    client = aws_clients.probe("dynamodb", region)
    try:
        client.describe_table(TableName=table)
    except Exception as error:
        if not does_not_answer(error):
            return True
        print(f"{region} does not answer ({error}): answered from the regions that do; its "
              "groups are left out (runbooks/region-down.md)", file=sys.stderr)  # fmt: skip
        return False
    return True
