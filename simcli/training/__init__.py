"""Training-iteration simulation: step costs, memory, the pipeline simulator, plan search."""
