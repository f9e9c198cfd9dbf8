"""Web environments (task apps in their own sandbox), the web task family's site app, browser tooling."""
