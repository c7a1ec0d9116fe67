"""Pulsar's family in the decision core: namespace bundles, failure domains and
anti-affinity, Pulsar's placement strategies, its three load shedders and the policy that
runs them as Ballast's rebalancing (`policy`). Pure, like the Danube core it builds on."""
