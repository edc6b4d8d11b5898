"""Wireless links between users and the edge server: path loss, Shannon rates, transfer times.

Each user has a dedicated (orthogonal) uplink and downlink channel of fixed bandwidth. With
transmit and noise power spectral densities ``p`` and ``N0`` (W/Hz) and channel gain ``g``,
``rate = B * log2(1 + p * g / N0)`` bit/s (no fading, as in the BALANCE paper's setup).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from envs.config import EnvConfig


def dbm_to_watt(dbm: ArrayLike) -> np.ndarray:
    """Watts of a power in dBm."""
    return 10.0 ** ((np.asarray(dbm, dtype=float) - 30.0) / 10.0)


def path_loss_db(distance_m: ArrayLike, cfg: EnvConfig) -> np.ndarray:
    """``PL = a + b * log10(d / 1 km)`` in dB (3GPP urban macro form, 128.1 + 37.6 log10 d_km)."""
    return cfg.path_loss_db_at_1km + cfg.path_loss_slope_db * np.log10(np.asarray(distance_m, dtype=float) / 1000.0)


def link_rates_bps(distance_m: ArrayLike, cfg: EnvConfig) -> tuple[np.ndarray, np.ndarray]:
    """Uplink and downlink Shannon rates (bit/s) of users at ``distance_m`` metres."""
    gain = 10.0 ** (-path_loss_db(distance_m, cfg) / 10.0)
    noise = dbm_to_watt(cfg.noise_psd_dbm_per_hz)
    snr_up = dbm_to_watt(cfg.uplink_psd_dbm_per_hz) * gain / noise
    snr_down = dbm_to_watt(cfg.downlink_psd_dbm_per_hz) * gain / noise
    return cfg.uplink_bandwidth_hz * np.log2(1.0 + snr_up), cfg.downlink_bandwidth_hz * np.log2(1.0 + snr_down)


def transfer_time_s(tokens: ArrayLike, rate_bps: ArrayLike, cfg: EnvConfig) -> np.ndarray:
    """Seconds to send ``tokens`` tokens at ``rate_bps`` (``bits_per_token`` bits each)."""
    return np.asarray(tokens, dtype=float) * cfg.bits_per_token / np.asarray(rate_bps, dtype=float)
