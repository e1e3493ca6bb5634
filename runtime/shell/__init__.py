"""The shell's rules: binding leases, worker retention and surfacing, resource limits."""
