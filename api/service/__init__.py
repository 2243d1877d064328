"""The HTTP service: routes, admission, intake, the plan cache and the settings."""
