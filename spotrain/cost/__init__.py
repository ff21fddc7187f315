"""Cost before a run starts: the price book (`prices`), spot availability traces (`traces`),
their replay against each strategy (`simulation`) and the planner (`planner`)."""
