"""Offline analysis of online experiments: ``report`` joins the served log (what each arm answered) with an
outcome log (what the users then did) into per-arm CTR, UCTR, gain and NDCG with bootstrap intervals
(`offgraph experiment report`)."""
