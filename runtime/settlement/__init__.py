"""Settlement: executors, the release sweep, the fleet yield and its cost in money."""
