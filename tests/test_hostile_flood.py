"""Issue 29, item 1, against a real server in another process: a flood of forged SETUPs (1,000 sessions
asking for 64 MiB terms, then 1,000 asking for the 64 KiB the handshake port accepts, each with a forged
HELLO) costs the server a bounded, stated amount, and a legitimate client connects and exchanges a
message during and after it (``bench/hostile.py`` runs the same flood and records the figures)."""

from __future__ import annotations

from bench.hostile import run
from slipstream.logbuffer import compute_log_length
from slipstream.network.transport import HANDSHAKE_CLIENT_TERM_LENGTH, HANDSHAKE_IMAGES

MIB = 1024 * 1024
SHM_BUDGET = HANDSHAKE_IMAGES * compute_log_length(HANDSHAKE_CLIENT_TERM_LENGTH)
"""The stated worst case: every image the handshake port may hold, each log's pages all written."""
RSS_BUDGET = 64 * MIB
"""Resident growth at the flood's peak (the image logs' written pages, their objects, the handshake table)."""
FDS_BUDGET = 3 * HANDSHAKE_IMAGES + 32
"""Open files at the peak: a handful per image (its log's mappings on both sides of the embedded driver)."""


def test_a_forged_setup_flood_costs_the_stated_budget_and_lets_a_client_in() -> None:
    assert SHM_BUDGET <= 32 * MIB  # the target, by construction
    result = run(sessions=1000, handshake_timeout=2.0)  # raises if a legitimate exchange fails
    peak, after = result["growth_peak"], result["growth_after"]
    assert peak["shm_bytes"] <= SHM_BUDGET, result
    assert peak["rss_bytes"] <= RSS_BUDGET, result
    assert peak["fds"] <= FDS_BUDGET, result
    # Every 64 MiB SETUP was refused (none made an image), and so were the 64 KiB ones beyond the budget.
    assert result["counters_at_peak"]["SETUPs refused"] >= 1000, result
    # Images that held no handshake were rejected within the handshake timeout: their memory came back.
    assert result["counters_after"]["Images rejected"] >= 100, result
    assert after["shm_bytes"] <= 2 * MIB and after["fds"] <= 8, result
    times = result["legit_connect_echo_s"]
    assert times["during"] < 10 and times["after"] < 10, times
