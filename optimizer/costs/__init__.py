"""The cost model: the cost profile (measured or analytical), the profile zoo, and the cost tables
every planner, bound and formulation reads."""
