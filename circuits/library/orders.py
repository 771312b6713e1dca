"""An order workflow as a KLogs state machine: ``created -> paid -> shipped``.

One keyed log of order events (key: the order id, value: ``{"event": ...}``).  Each
order's state is its status; an event that follows the status moves it on and emits
``{"order", "status"}``, any other is reported as ``{"order", "invalid", "status"}``
(the status stays).
"""

from __future__ import annotations

from typing import Any

from ..klogs import KLog, KLogsCircuit, deploy

ORDERS = "orders"
NEXT = {None: "created", "created": "paid", "paid": "shipped"}
"""The one event each status accepts (None: an order not yet created)."""


def transition(status: str | None, order: Any, event: dict) -> tuple[str | None, list[dict]]:
    wanted = NEXT.get(status)
    if event.get("event") != wanted:
        return status, [{"order": order, "invalid": event.get("event"), "status": status}]
    return wanted, [{"order": order, "status": wanted}]


def order_workflow(sink=print, name: str = "order_workflow") -> KLogsCircuit:
    """The workflow over the log ``orders``, its reports handed to ``sink(order, report)``."""
    orders = KLog.named(ORDERS)

    def pipeline() -> None:
        orders.loop(None, transition).sink(sink)

    return deploy(pipeline, name)
