"""Every benchmark of bench/ runs and reports what it measures."""
