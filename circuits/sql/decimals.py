"""Spark's decimal ``avg``, exactly, as Spark SQL over a maintained sum and count.

Spark's ``avg`` of a ``decimal(p, s)`` divides the ``decimal(p + 10, s)`` sum by the count
as Java's ``BigDecimal`` does (39 decimals, truncated) and rounds the quotient HALF_UP to
``decimal(p + 4, s + 4)`` (each bounded by 38): the exact quotient rounded once.  SQL's
``/`` cannot say it: its result type keeps ``max(6, 38 - integer digits)`` decimals, so
from ``p = 25`` on it rounds away digits ``avg`` keeps.  What it can say exactly is
integer arithmetic within ``decimal(38, 0)``, and that is enough for long division: the
dividend's digits in chunks of 18, each step ``r * 10^18 + chunk`` below ``10^37`` since
the running remainder ``r`` is below the count (below ``10^19``).
"""

from __future__ import annotations

CHUNK = 18
"""Digits per long-division step: ``r * 10^CHUNK + chunk`` must fit ``decimal(38, 0)``."""

CHUNKS = 3
"""Steps: the dividend has at most 38 digits and 4 more decimals, 42 <= 3 * 18."""


def exact_average(total: str, count: str, scale: int, precision_out: int, scale_out: int) -> str:
    """Spark SQL of ``total / count`` rounded HALF_UP (away from zero on a tie) to
    ``decimal(precision_out, scale_out)``, ``total`` being a ``decimal(_, scale)`` and
    ``count`` an integer; NULL when either is NULL or the count is 0."""
    divisor = f"CAST(NULLIF({count}, 0) AS DECIMAL(19, 0))"
    # The dividend |total| * 10^scale_out as a whole number: its digits, padded on the left
    # (not from abs(), which drops the last digits of a decimal(38, 38) in Spark 4.2).
    digits = f"translate(CAST({total} AS STRING), '-.', '')"
    dividend = f"lpad(concat({digits}, repeat('0', {scale_out - scale})), {CHUNK * CHUNKS}, '0')"
    remainder, quotient = "CAST(0 AS DECIMAL(19, 0))", []
    for i in range(CHUNKS):
        chunk = f"CAST(substr({dividend}, {CHUNK * i + 1}, {CHUNK}) AS DECIMAL({CHUNK}, 0))"
        partial = f"({remainder} * CAST(1{'0' * CHUNK} AS DECIMAL(19, 0)) + {chunk})"
        remainder = f"({partial} % {divisor})"
        # The division of a multiple of the divisor is exact whatever scale SQL gives it.
        digit_group = f"CAST(({partial} - {remainder}) / {divisor} AS DECIMAL({CHUNK}, 0))"
        quotient.append(f"lpad(CAST({digit_group} AS STRING), {CHUNK}, '0')")
    rounded = (
        f"CAST(concat({', '.join(quotient)}) AS DECIMAL(38, 0))"
        f" + CASE WHEN 2 * {remainder} >= {divisor} THEN 1 ELSE 0 END"
    )
    signed = f"concat(CASE WHEN {total} < 0 THEN '-' ELSE '' END, CAST({rounded} AS STRING), 'E-{scale_out}')"
    return f"CAST({signed} AS DECIMAL({precision_out}, {scale_out}))"
