"""LLM serving: continuously batching engines per replica (host.py), the client that sends
requests and stamps every token (load.py), token-level figures and the Pareto front
(figures.py), and one trial end to end (run.py)."""
