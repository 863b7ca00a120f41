"""Analyzer: progressive fail-slow diagnosis (L1 iteration, L2 phase, L3 kernel), causes and lifecycle."""
