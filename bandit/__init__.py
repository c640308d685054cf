"""agiledart.bandit: KL-UCB shuffle path planning (paper §V, Algorithm 1).

Pure and fast: numpy, no I/O but the graph file functions, no clock, randomness only
from the seed given to the simulator.

* :mod:`~agiledart.bandit.klucb`: the link cost ω = 1/u*, the KL-UCB upper bound.
* :mod:`~agiledart.bandit.paths`: J, shortest paths over ω toward the sink.
* :mod:`~agiledart.bandit.relay`: :class:`HopPlanner`, the per-hop decision at one
  relay peer (its out-links' statistics, its neighbours' advertised J).
* :mod:`~agiledart.bandit.policies`: AgileDART (all hops, or hop-limited), end-to-end
  LCB, next-hop and optimal routing over a whole graph.
* :mod:`~agiledart.bandit.simulator`: the regret simulator, with per-hop trace dicts.
* :mod:`~agiledart.bandit.graph`, :mod:`~agiledart.bandit.generators`: networks, their
  JSON file format, and road-like networks of the paper's sizes.

Exceptions (:mod:`~agiledart.bandit.errors`)::

    BanditError(AgiledartError)
    ├── GraphError           bad graph file or graph; .field names the field
    ├── NoRouteError         no loop-free next hop toward the sink
    ├── BanditUsageError     local misuse
    └── AdvertisementError   a neighbour advertised an impossible J
"""

from agiledart.bandit.errors import (
    AdvertisementError,
    BanditError,
    BanditUsageError,
    GraphError,
    NoRouteError,
)
from agiledart.bandit.generators import (
    EXPLORATION_NETWORKS,
    PAPER_SIZES,
    exploration_network,
    paper_network,
    road_network,
)
from agiledart.bandit.graph import Graph, load_graph, save_graph
from agiledart.bandit.klucb import kl_bernoulli, kl_ucb_cost, kl_ucb_upper
from agiledart.bandit.paths import costs_to_sink, optimal_path
from agiledart.bandit.policies import (
    DEFAULT_EXPLORATION,
    EndToEndLcbRouting,
    KlUcbRouting,
    NextHopRouting,
    OptimalRouting,
    RoutingPolicy,
)
from agiledart.bandit.relay import HopPlanner, LinkState
from agiledart.bandit.simulator import SimResult, simulate

__all__ = [
    "DEFAULT_EXPLORATION",
    "EXPLORATION_NETWORKS",
    "PAPER_SIZES",
    "AdvertisementError",
    "BanditError",
    "BanditUsageError",
    "EndToEndLcbRouting",
    "Graph",
    "GraphError",
    "HopPlanner",
    "KlUcbRouting",
    "LinkState",
    "NextHopRouting",
    "NoRouteError",
    "OptimalRouting",
    "RoutingPolicy",
    "SimResult",
    "costs_to_sink",
    "exploration_network",
    "kl_bernoulli",
    "kl_ucb_cost",
    "kl_ucb_upper",
    "load_graph",
    "optimal_path",
    "paper_network",
    "road_network",
    "save_graph",
    "simulate",
]
