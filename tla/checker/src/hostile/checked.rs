//! [`HostileModel`] as a stateright [`Model`]: the transitions of the
//! hostile-relay model, its properties, and each action as its trace names it.

use stateright::{Model, Property};

use super::model::{HAction, HState, HostileModel};
use super::{properties, trace};

impl Model for HostileModel {
    type State = HState;
    type Action = HAction;

    fn init_states(&self) -> Vec<HState> {
        self.initial_states()
    }

    fn actions(&self, s: &HState, out: &mut Vec<HAction>) {
        self.enabled(s, out)
    }

    fn next_state(&self, s: &HState, a: HAction) -> Option<HState> {
        self.next(s, a)
    }

    fn format_action(&self, a: &HAction) -> String {
        trace::describe_action(self, a)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
