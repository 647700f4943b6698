"""Human-readable byte counts, speeds and durations for progress lines and messages."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """Decimal units, as the Hub and disk tools show sizes: 16.1 GB, 850 MB, 4.2 kB."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            if unit == "B":
                return f"{sign}{int(n)} B"
            return f"{sign}{n:.1f} {unit}" if n < 100 else f"{sign}{n:.0f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def format_speed(bytes_per_s: float) -> str:
    return f"{format_bytes(bytes_per_s)}/s"


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60:d}:{s % 60:02d}"
