"""Evaluation: pass@k / pass^k metrics, behaviour analytics from captured traces, reports."""
