"""Many runs for one question: one configuration over several seeds (`seeds`), and Optuna sweeps that
many workers share (`sweep`). Each run inside them is an ordinary run in its own folder."""
