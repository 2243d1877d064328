"""Independent verification of a plan against its problem."""
