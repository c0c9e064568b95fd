"""The inference worker: ``echorl worker`` joins a coordinator and turns leased tasks into rollouts."""
