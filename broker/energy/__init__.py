"""Energy and carbon: the energy model, on-prem prices, and the carbon signals of snapshots."""
