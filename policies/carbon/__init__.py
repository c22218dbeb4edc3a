"""Carbon: waits and starts decided before placement, carbon-aware placement, the cleanest
window and the one objective."""
