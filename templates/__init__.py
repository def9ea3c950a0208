"""Templates that clusterctl renders (installed as the package clusterctl.templates)."""
