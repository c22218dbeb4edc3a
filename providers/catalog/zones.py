"""Which electricity grid each cloud region draws from: region -> carbon zone.

A carbon zone is an Electricity Maps zone key (the names used by its API and by
``../shared/data/carbon_electricitymaps_hourly_2021_2023``, e.g. ``US-CAL-CISO``). A region maps
to the zone of the balancing authority (US) or the national grid (Europe) that serves the
metro the provider names for it. Pure data; docs/catalog.md shows the table with its sources.

Sources
-------
[AWS] AWS, "Regions, Availability Zones, and Local Zones" (docs.aws.amazon.com/AWSEC2/latest/
      UserGuide/using-regions-availability-zones.html): the metro each region names.
[GCP] Google Cloud, "Cloud locations" (cloud.google.com/about/locations) and Google,
      "Data center locations" (google.com/about/datacenters/locations): the town of each region.
[BA]  U.S. EIA, Form EIA-930 balancing-authority map (eia.gov/electricity/gridmonitor): which
      balancing authority serves that town.
[EM]  Electricity Maps zone keys (github.com/electricitymaps/electricitymaps-contrib,
      ``config/zones/<key>.yaml``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ZoneEntry:
    provider: str
    region: str
    carbon_zone: str  # Electricity Maps zone key
    where: str  # the place the provider names
    why: str  # the grid serving it, and the sources


ZONES: tuple[ZoneEntry, ...] = (
    ZoneEntry("aws", "us-east-1", "US-MIDA-PJM", "N. Virginia",
              "Dominion Energy in PJM [AWS][BA][EM]"),
    ZoneEntry("aws", "us-east-2", "US-MIDA-PJM", "Ohio", "AEP Ohio in PJM [AWS][BA][EM]"),
    ZoneEntry("aws", "us-west-1", "US-CAL-CISO", "N. California", "CAISO [AWS][BA][EM]"),
    ZoneEntry("aws", "us-west-2", "US-NW-BPAT", "Oregon", "Bonneville Power Administration "
              "[AWS][BA][EM]"),
    ZoneEntry("aws", "ca-central-1", "CA-QC", "Canada Central (Montreal)", "Hydro-Quebec "
              "[AWS][EM]"),
    ZoneEntry("aws", "eu-west-1", "IE", "Ireland", "national grid [AWS][EM]"),
    ZoneEntry("aws", "eu-west-2", "GB", "London", "national grid [AWS][EM]"),
    ZoneEntry("aws", "eu-west-3", "FR", "Paris", "national grid [AWS][EM]"),
    ZoneEntry("aws", "eu-central-1", "DE", "Frankfurt", "national grid [AWS][EM]"),
    ZoneEntry("aws", "eu-north-1", "SE-SE3", "Stockholm", "bidding zone SE3 [AWS][EM]"),
    ZoneEntry("gcp", "us-central1", "US-MIDW-MISO", "Council Bluffs, Iowa",
              "MidAmerican Energy in MISO [GCP][BA][EM]"),
    ZoneEntry("gcp", "us-east1", "US-CAR-SC", "Moncks Corner, South Carolina",
              "Santee Cooper (South Carolina Public Service Authority) [GCP][BA][EM]"),
    ZoneEntry("gcp", "us-east4", "US-MIDA-PJM", "Ashburn, N. Virginia",
              "Dominion Energy in PJM [GCP][BA][EM]"),
    ZoneEntry("gcp", "us-west1", "US-NW-BPAT", "The Dalles, Oregon",
              "Bonneville Power Administration [GCP][BA][EM]"),
    ZoneEntry("gcp", "us-west2", "US-CAL-LDWP", "Los Angeles",
              "Los Angeles Department of Water and Power [GCP][BA][EM]"),
    ZoneEntry("gcp", "us-west4", "US-NW-NEVP", "Las Vegas", "NV Energy (Nevada Power) "
              "[GCP][BA][EM]"),
    ZoneEntry("gcp", "europe-west1", "BE", "St. Ghislain, Belgium", "national grid [GCP][EM]"),
    ZoneEntry("gcp", "europe-west4", "NL", "Eemshaven, Netherlands", "national grid [GCP][EM]"),
)

_BY_REGION = {(z.provider, z.region): z.carbon_zone for z in ZONES}


def carbon_zone(provider: str, region: str) -> str:
    """The Electricity Maps zone of a cloud region; "" when the table does not know it."""
    return _BY_REGION.get((provider, region), "")


def site_zone(site: str, onprem: Mapping[str, str] | None = None) -> str:
    """The carbon zone of a site id (``onprem``, ``aws:us-east-1:spot``,
    ``gcp:us-east1:us-east1-c:ondemand``): on-prem sites from ``onprem`` (site id -> zone, as
    configured per site: ``energy.sites`` in docs/carbon.md), cloud sites from :data:`ZONES` by
    provider and region; "" when neither knows it."""
    if onprem and site in onprem:
        return onprem[site]
    parts = site.split(":")
    return carbon_zone(parts[0], parts[1]) if len(parts) >= 3 else ""
