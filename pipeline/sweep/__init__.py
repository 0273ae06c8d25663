"""`mmcurate sweep`: filters, thresholds and source mixtures chosen by proxy training."""
