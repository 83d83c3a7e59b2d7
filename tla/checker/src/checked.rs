//! [`AbhyasaModel`] as a stateright [`Model`]: the transitions of `model`,
//! the properties of `properties`, and each action as `trace` names it.

use stateright::{Model, Property};

use crate::model::{AbhyasaModel, Action};
use crate::system::State;
use crate::{properties, trace};

impl Model for AbhyasaModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        self.initial_states()
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        self.enabled(s, out)
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        self.next(s, a)
    }

    fn format_action(&self, a: &Action) -> String {
        trace::describe_action(self, a)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
