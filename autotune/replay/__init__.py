"""Learning from the daemon's logs: export logged decisions as RLlib offline data, retrain a
policy from them, and evaluate candidates against the logging policy (counterfactual
simulation and off-policy estimates)."""
