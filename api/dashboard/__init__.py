"""The solver tuning dashboard: its routes, views and static pages."""
